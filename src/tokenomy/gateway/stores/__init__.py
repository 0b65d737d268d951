"""Where token-operations state lives: each kind of state behind one typed interface.

=====================  =================================  ==========================================
state                  interface                          implementations (chosen in gateway.yaml)
=====================  =================================  ==========================================
budget holds/spend     ``reservations.Reservations``      ``InProcessReservations`` (``ops.reservations:
                                                          memory``), ``reservations_sql.SqlReservations``
                                                          (``sql``, the default); a fleet (``ops.shared``):
                                                          ``redis_reservations.RedisReservations``
RPM/TPM, concurrency   ``limits.RateLimits``              ``InProcessRateLimits``; a fleet:
                                                          ``redis_limits.RedisRateLimits``
breaker state          ``ops.breaker.Breakers``           in process; a fleet: ``redis_breakers.RedisBreakers``
session bindings       (routing)                          a fleet: ``redis_routing.RedisSessionBindings``
in-flight counts       ``in_flight.InFlightExchange``     none embedded (one process's own counts); a
                                                          fleet: ``redis_routing.RedisInFlight``
usage ledger           ``metering.ledger.Ledger``         ``ledger_sql.SqlLedger`` (``ledger.url``); a fleet:
                                                          ``pg_ledger.PgLedger`` (PostgreSQL, asyncpg)
tenants and keys       ``tenancy_sql.TenantStore``        SQL (``ops.db_url``, else the ledger's); a fleet:
                                                          ``pg_tenancy.PgTenantStore``
=====================  =================================  ==========================================

The embedded interfaces are synchronous except the ledger's ``record``/``session_state``/``exists``:
each atomic step (reserve = check every charge and add; settle/release idempotent per request id;
acquire = check every bucket and charge) runs inside one call with nothing awaited between check
and charge. The fleet's stores are async and keep the same atomicity inside the server: one Lua
script per step (Redis), one transaction per group commit (PostgreSQL); ``ops.fleet_guard`` uses
them. ``budget_seed`` rebuilds spend from the ledger at start-up. ``servers`` starts a local
``redis-server`` and PostgreSQL (tests, ``tokenomy up`` with a fleet).
"""
