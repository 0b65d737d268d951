"""Where a request goes: backends and their health, routing config, P/D disaggregation, live AMPD and its gates, the upstream HTTP client."""
