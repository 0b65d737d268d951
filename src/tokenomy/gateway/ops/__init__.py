"""Token operations: tenancy, API keys, rate limits, budgets, breakers, alerts, priority admission, the guard and the admin API."""
