"""Chaos and soak runs of a whole gateway fleet (``benchmarks/chaos.py``, the fleet chaos test): 3
replicas on one Redis and one PostgreSQL, emulated engines, agent load, a seeded fault schedule,
and an audit of the ledger, budgets and holds afterwards. Depends on bench, emulator and gateway."""
