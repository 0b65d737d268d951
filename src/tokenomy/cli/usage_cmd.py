"""``tokenomy usage``: the ledger summed per tenant, key, model or session (token classes, cost, savings)."""

from __future__ import annotations

import argparse
import json
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
    from tokenomy.gateway.config import load_config

    if args.db is None:
        return load_config(args.config).ledger.url
    if "://" in args.db:
        return str(args.db)
    path = Path(args.db)
    if not path.is_file():
        raise ValueError(f"--db {path}: no such file")
    return f"sqlite:///{path}"


def run_usage(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tokenomy.gateway.errors import GatewayError
    from tokenomy.gateway.metering.ledger import UsageFilter
    from tokenomy.gateway.metering.usage_api import group_usage, parse_time
    from tokenomy.gateway.stores.ledger_sql import SqlLedger

    try:
        since, until = parse_time(args.since, "since"), parse_time(args.until, "until")
    except GatewayError as err:
        raise ValueError(f"--{err.param}: {err.message}") from None
    url = _url(args)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise ValueError(f"ledger {url}: no such file (has the gateway run here?)")
    ledger = SqlLedger(url)
    try:
        events = ledger.query(UsageFilter(tenant_prefix=args.tenant, model=args.model, session_id=args.session,
                                          since_s=since, until_s=until, limit=10_000_000))
    finally:
        ledger.close()
    groups = group_usage(events, args.by)
    table = Table(title=f"usage by {args.by} ({len(events)} requests)")
    cols = ("requests", "input_tokens", "incremental_prefill_tokens", "history_tokens", "output_tokens",
            "cached_tokens", "recomputed_tokens", "cost_usd", "cache_savings_usd")
    heads = ("requests", "input", "incr. prefill", "history", "output", "cached", "recomputed", "cost $", "saved $")
    table.add_column(args.by, no_wrap=True, min_width=max([len(n) for n in groups] + [6]))
    for h in heads:
        table.add_column(h, justify="right", no_wrap=True)
    for name, row in groups.items():
        table.add_row(name or "(none)", *(f"{row[c]:.6f}" if c.endswith("usd") else str(row[c]) for c in cols))
    Console(width=max(Console().width, 140)).print(table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"by": args.by, "groups": groups}, indent=2))
    return 0
