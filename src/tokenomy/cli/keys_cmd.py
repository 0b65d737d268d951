"""``tokenomy keys``: API keys of the gateway (create — shown once —, list, revoke, new)."""

from __future__ import annotations

import argparse

from tokenomy.cli.tenancy_args import add_limit_args, add_store_args, limits_from, open_store, print_nodes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="the gateway's API keys: create, list, revoke")
    k = p.add_subparsers(dest="keys_command", required=True)
    create = k.add_parser("create", help="a key under a team; prints the key once (only a digest is kept)")
    create.add_argument("--team", required=True, help="the team's id")
    create.add_argument("--name", required=True)
    add_store_args(create)
    add_limit_args(create)
    create.set_defaults(func=_create)
    ls = k.add_parser("list", help="every key, by id and hint (never the key itself)")
    add_store_args(ls)
    ls.set_defaults(func=_list)
    rev = k.add_parser("revoke", help="revoke a key; a running gateway refuses it on its next request")
    rev.add_argument("id")
    add_store_args(rev)
    rev.set_defaults(func=_revoke)
    new = k.add_parser("new", help="print a fresh random key (for ops.tenants seeds in a config)")
    new.set_defaults(func=_new)


def _create(args: argparse.Namespace) -> int:
    node, raw = open_store(args).create_key(args.team, args.name, limits_from(args))
    print(f"{node.id}\t{raw}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from tokenomy.gateway.ops.tenancy import NodeKind

    store = open_store(args)
    print_nodes([n for n in store.tree.nodes() if n.kind is NodeKind.KEY], store.key_hints())
    return 0


def _revoke(args: argparse.Namespace) -> int:
    node = open_store(args).revoke(args.id)
    print(f"revoked key {node.id}")
    return 0


def _new(args: argparse.Namespace) -> int:
    from tokenomy.gateway.ops.keys import new_api_key

    print(new_api_key())
    return 0
