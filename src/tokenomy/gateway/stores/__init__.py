"""Where token-operations state lives: each kind of state behind one typed interface.

=====================  =================================  ==========================================
state                  interface                          implementations (chosen in gateway.yaml)
=====================  =================================  ==========================================
breakers, RPM/TPM,     ``guard_state.GuardState`` (async) ``local_state.LocalState`` (embedded: memory,
concurrency, budget                                       holds in memory or SQLite, ``ops.reservations``);
holds and spend                                           a fleet (``ops.shared``):
                                                          ``redis_state.RedisState``
budget holds, in       ``reservations.Reservations``      ``InProcessReservations`` (``memory``, the
one process                                               default), ``reservations_sql.SqlReservations``
                                                          (``sql``)
session bindings       (routing)                          a fleet: ``redis_routing.RedisSessionBindings``
in-flight counts       ``in_flight.InFlightExchange``     none embedded (one process's own counts); a
                                                          fleet: ``redis_routing.RedisInFlight``
usage ledger           ``metering.ledger.Ledger``         ``ledger_sql.SqlLedger`` (``ledger.url``); a fleet:
                                                          ``pg_ledger.PgLedger`` (PostgreSQL, asyncpg)
tenants and keys       ``tenancy_sql.TenantStore``        SQL (``ops.db_url``, else the ledger's); a fleet:
                                                          ``pg_tenancy.PgTenantStore``
=====================  =================================  ==========================================

``GuardState`` is what ``ops.ops_guard.OpsGuard`` (the one Guard) reads and charges: each of its
steps is atomic inside the store — ``LocalState`` runs a step under its lock with no await inside
(checks first, then charges; the SQLite hold is one ``BEGIN IMMEDIATE`` transaction), ``RedisState``
runs it as one Lua script (``redis_admission``: the bucket, hold and breaker steps of
``redis_limits``, ``redis_reservations`` and ``redis_breakers``). Both are held to one contract
(``tests/gateway/stores/test_guard_state.py``). ``budget_seed`` rebuilds spend from the ledger at
start-up. ``servers`` starts a local ``redis-server`` and PostgreSQL (tests, ``tokenomy up`` with a
fleet).
"""
