"""``tokenomy usage``: the ledger summed per tenant, key, model or session (token classes, cost, savings)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("usage", help="token classes, cost and cache savings from the gateway's ledger")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", default=None, help="gateway.yaml whose ledger to read (default config if neither)")
    src.add_argument("--db", default=None, help="ledger SQLAlchemy URL or SQLite file path")
    p.add_argument("--by", default="tenant", choices=["tenant", "key", "model", "session", "backend"])
    p.add_argument("--tenant", default=None, help="only this tenant path (org[/team[/key]]) and below")
    p.add_argument("--model", default=None)
    p.add_argument("--session", default=None)
    p.add_argument("--since", default=None, help="Unix seconds or ISO 8601")
    p.add_argument("--until", default=None, help="Unix seconds or ISO 8601")
    p.add_argument("--json", default=None, help="also write the groups to this JSON file")
    p.set_defaults(func=run_usage)


def _url(args: argparse.Namespace) -> str:
    """The ledger's URL: ``--db``, else the config's: a fleet's PostgreSQL (``ops.shared``) or ``ledger.url``."""
    from tokenomy.gateway.config import load_config
    from tokenomy.gateway.ops.config import ops_config
    from tokenomy.gateway.stores.pg_tenancy import pg_sync_url

    if args.db is None:
        config = load_config(args.config)
        shared = ops_config(config).shared
        return pg_sync_url(shared.postgres_url) if shared is not None else config.ledger.url
    if "://" in args.db:
        return str(args.db)
    path = Path(args.db)
    if not path.is_file():
        raise ValueError(f"--db {path}: no such file")
    return f"sqlite:///{path}"


def _tenants_url(args: argparse.Namespace, ledger_url: str) -> str:
    """Where the tenant tree's names live: ``ops.db_url`` of the config, else the ledger's database."""
    if args.db is not None:
        return ledger_url
    from tokenomy.gateway.config import load_config
    from tokenomy.gateway.ops.config import ops_config

    return ops_config(load_config(args.config)).db_url or ledger_url


def _outbox_note(args: argparse.Namespace) -> tuple[int, str | None]:
    """Events a fleet's replicas hold in their ledger outboxes (not yet in PostgreSQL, so not in the
    table), and the line that says so; (0, None) for a ``--db`` or a config without an outbox."""
    if args.db is not None:
        return 0, None
    import time

    from tokenomy.gateway.config import load_config
    from tokenomy.gateway.ops.config import ops_config
    from tokenomy.gateway.stores.outbox import queued_in

    shared = ops_config(load_config(args.config)).shared
    if shared is None or shared.on_outage.ledger != "outbox":
        return 0, None
    n, oldest = queued_in(shared.outbox_dir)
    if n == 0:
        return 0, None
    age_min = (time.time() - oldest) / 60.0 if oldest is not None else 0.0
    return n, (f"{n} usage events (oldest queued {age_min:.0f} min ago) are still in the ledger outboxes in "
               f"{shared.outbox_dir}, not yet in PostgreSQL, so not in this table: a running replica drains its "
               "own; start a replica from that directory to drain a dead one's (docs/gateway-ops.md)")


def run_usage(args: argparse.Namespace) -> int:
    import sqlalchemy as sa
    from rich.console import Console

    from tokenomy.gateway.errors import GatewayError
    from tokenomy.gateway.metering.ledger import UsageFilter
    from tokenomy.gateway.metering.usage_api import group_usage, parse_time
    from tokenomy.gateway.metering.usage_view import grouped_rows, node_names, usage_table
    from tokenomy.gateway.stores.ledger_sql import SqlLedger

    try:
        since, until = parse_time(args.since, "since"), parse_time(args.until, "until")
    except GatewayError as err:
        raise ValueError(f"--{err.param}: {err.message}") from None
    url = _url(args)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise ValueError(f"ledger {url}: no such file (has the gateway run here?)")
    try:
        ledger = SqlLedger(url)
        try:
            events = ledger.query(UsageFilter(tenant_prefix=args.tenant, model=args.model, session_id=args.session,
                                              since_s=since, until_s=until, limit=10_000_000))
        finally:
            ledger.close()
    except sa.exc.OperationalError as e:
        raise ValueError(f"ledger database unreachable: {str(e.orig or e).strip().splitlines()[0]}") from None
    groups = group_usage(events, args.by)
    names = node_names(_tenants_url(args, url)) if args.by in ("tenant", "key") else {}
    rows = grouped_rows(events, args.by, names)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=120)  # piped: the table's width, not rich's 80
    console.print(usage_table(rows, args.by, title=f"usage by {args.by} ({len(events)} requests)"))
    outboxed, note = _outbox_note(args)
    if note is not None:
        console.print(f"[yellow]{note}[/]", markup=True, highlight=False)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"by": args.by, "groups": groups, "names": names,
                                               "outbox_events": outboxed}, indent=2))
    return 0
