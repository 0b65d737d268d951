"""Shared pieces of ``tokenomy keys`` and ``tokenomy tenants``: the store, limit flags, output."""

from __future__ import annotations

import argparse
from typing import Any

from tokenomy.cli.common import CLIError


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="gateway.yaml (default: the documented default config)")


def add_limit_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("limits (unset: inherit the parent's)")
    g.add_argument("--rpm", type=int, default=None, help="requests per minute")
    g.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    g.add_argument("--max-concurrent", type=int, default=None, help="requests in flight at once")
    g.add_argument("--budget-usd", type=float, default=None, help="spend allowed per budget period")
    g.add_argument("--budget-period", choices=["day", "month"], default="month")
    g.add_argument("--priority", type=int, default=None, help="0..100, higher is served first")
    g.add_argument("--models", default=None, help="comma-separated allowed models")


def limits_from(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from tokenomy.gateway.ops.tenancy import NodeLimits

    data: dict[str, Any] = {"rpm": args.rpm, "tpm": args.tpm, "max_concurrent": args.max_concurrent,
                            "budget_usd": args.budget_usd, "budget_period": args.budget_period,
                            "priority": args.priority}
    if args.models is not None:
        data["allowed_models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
    try:
        return NodeLimits.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        flag = "--" + str(e["loc"][0]).replace("_", "-") if e["loc"] else "limits"
        raise CLIError(f"{flag}: {e['msg']}") from None


def open_store(args: argparse.Namespace) -> Any:
    from tokenomy.gateway.config import load_config
    from tokenomy.gateway.ops.config import open_tenant_store

    config = load_config(args.config)
    return open_tenant_store(config, config.ledger.url)


def print_nodes(nodes: list[Any], hints: dict[str, str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in ("id", "kind", "name", "parent", "revoked", "limits", *(["key"] if hints is not None else [])):
        table.add_column(col, no_wrap=col in ("id", "parent", "key"))
    for n in nodes:
        limits = n.limits.model_dump(exclude_defaults=True)
        row = [n.id, n.kind.value, n.name, n.parent_id or "", "yes" if n.revoked else "",
               ", ".join(f"{k}={v}" for k, v in limits.items())]
        if hints is not None:
            row.append(hints.get(n.id, ""))
        table.add_row(*row)
    Console().print(table)
