"""Where token-operations state lives: each kind of state behind one typed interface.

=====================  =================================  ==========================================
state                  interface                          implementations (chosen in gateway.yaml)
=====================  =================================  ==========================================
budget holds/spend     ``reservations.Reservations``      ``InProcessReservations`` (``ops.reservations:
                                                          memory``), ``reservations_sql.SqlReservations``
                                                          (``sql``, the default)
RPM/TPM, concurrency   ``limits.RateLimits``              ``InProcessRateLimits`` (always, today)
usage ledger           ``metering.ledger.Ledger``         ``ledger_sql.SqlLedger`` (``ledger.url``)
tenants and keys       ``tenancy_sql.TenantStore``        SQL only (``ops.db_url``, else the ledger's)
=====================  =================================  ==========================================

The interfaces are synchronous except the ledger's ``record``/``session_state``/``exists``: each
atomic step (reserve = check every charge and add; settle/release idempotent per request id;
acquire = check every bucket and charge) runs inside one call with nothing awaited between check
and charge. ``budget_seed`` rebuilds spend from the ledger at start-up.
"""
