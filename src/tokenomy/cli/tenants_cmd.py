"""``tokenomy tenants``: orgs and teams of the gateway's key tree (list, create, set limits, revoke)."""

from __future__ import annotations

import argparse

from tokenomy.cli.tenancy_args import add_limit_args, add_store_args, limits_from, open_store, print_nodes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tenants", help="the gateway's orgs and teams: list, create, set limits, revoke")
    t = p.add_subparsers(dest="tenants_command", required=True)
    ls = t.add_parser("list", help="every org and team")
    add_store_args(ls)
    ls.set_defaults(func=_list)
    org = t.add_parser("create-org", help="a new org")
    org.add_argument("name")
    add_store_args(org)
    add_limit_args(org)
    org.set_defaults(func=_create, kind="org", parent=None)
    team = t.add_parser("create-team", help="a new team under an org")
    team.add_argument("name")
    team.add_argument("--org", dest="parent", required=True, help="the org's id")
    add_store_args(team)
    add_limit_args(team)
    team.set_defaults(func=_create, kind="team")
    limits = t.add_parser("set-limits", help="replace a node's limits (refused above its parent's)")
    limits.add_argument("id")
    add_store_args(limits)
    add_limit_args(limits)
    limits.set_defaults(func=_set_limits)
    rev = t.add_parser("revoke", help="revoke an org or team: every key below it stops working")
    rev.add_argument("id")
    add_store_args(rev)
    rev.set_defaults(func=_revoke)


def _list(args: argparse.Namespace) -> int:
    from tokenomy.gateway.ops.tenancy import NodeKind

    store = open_store(args)
    print_nodes([n for n in store.tree.nodes() if n.kind is not NodeKind.KEY])
    return 0


def _create(args: argparse.Namespace) -> int:
    from tokenomy.gateway.ops.tenancy import NodeKind

    node = open_store(args).create_node(NodeKind(args.kind), args.name, args.parent, limits_from(args))
    print(node.id)
    return 0


def _set_limits(args: argparse.Namespace) -> int:
    store = open_store(args)
    print_nodes([store.update_limits(args.id, limits_from(args))])
    return 0


def _revoke(args: argparse.Namespace) -> int:
    node = open_store(args).revoke(args.id)
    print(f"revoked {node.kind.value} {node.id}")
    return 0
