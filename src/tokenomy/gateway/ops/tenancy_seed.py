"""Tenants declared in the config (``ops.tenants``), created at start-up when missing.

Nodes are matched by name under their parent, so restarting with the same config changes nothing;
a seed whose limits differ from the stored node's updates them (validated like an admin update).
A key seed may carry its raw ``key`` (for tests, benchmarks and demos: the config file then holds a
secret); without one, keys are created with ``tokenomy keys create`` or the admin API.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tokenomy.gateway.ops.keys import looks_like_key
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits
from tokenomy.gateway.stores.tenancy_sql import TenantStore


class KeySeed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    limits: NodeLimits = NodeLimits()
    key: str | None = Field(default=None, description="the raw tk-... key to accept (kept only hashed)")


class TeamSeed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    limits: NodeLimits = NodeLimits()
    keys: tuple[KeySeed, ...] = ()


class TenantSeed(BaseModel):
    """One org with its teams and keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    org: str = Field(min_length=1, max_length=200)
    limits: NodeLimits = NodeLimits()
    teams: tuple[TeamSeed, ...] = ()


def apply_seeds(store: TenantStore, seeds: tuple[TenantSeed, ...]) -> None:
    """Create or update the seeded nodes in ``store``."""
    for seed in seeds:
        org = _ensure(store, NodeKind.ORG, seed.org, None, seed.limits)
        for team_seed in seed.teams:
            team = _ensure(store, NodeKind.TEAM, team_seed.name, org, team_seed.limits)
            for key_seed in team_seed.keys:
                if key_seed.key is not None and not looks_like_key(key_seed.key):
                    raise ValueError(f"ops.tenants: key {key_seed.name!r} is not a tk-... key "
                                     "(generate one with `tokenomy keys new`)")
                existing = _find(store, NodeKind.KEY, key_seed.name, team)
                if existing is None:
                    store.import_key(team, key_seed.name, key_seed.key, key_seed.limits)
                elif store.tree.get(existing).limits != key_seed.limits:
                    store.update_limits(existing, key_seed.limits)


def _find(store: TenantStore, kind: NodeKind, name: str, parent_id: str | None) -> str | None:
    for node in store.tree.nodes():
        if node.kind is kind and node.name == name and node.parent_id == parent_id:
            return str(node.id)
    return None


def _ensure(store: TenantStore, kind: NodeKind, name: str, parent_id: str | None, limits: NodeLimits) -> str:
    found = _find(store, kind, name, parent_id)
    if found is None:
        return str(store.create_node(kind, name, parent_id, limits).id)
    if store.tree.get(found).limits != limits:
        store.update_limits(found, limits)
    return found
