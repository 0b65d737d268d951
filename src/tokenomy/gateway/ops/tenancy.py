"""The tenant tree (org → team → key) and the limits each node may set.

Invariant: a child is never granted more than its parent. ``TenantTree.check_child`` refuses a
node whose limit exceeds its parent's (for every limit the parent sets), at creation and update,
so the effective limit of a key — the minimum along its path — is simply the key's own where set.
``effective`` still takes the minimum along the path, so a tree loaded from a hand-edited database
cannot grant more than an ancestor either.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NodeKind(StrEnum):
    ORG = "org"
    TEAM = "team"
    KEY = "key"


PARENT_KIND: dict[NodeKind, NodeKind | None] = {
    NodeKind.ORG: None,
    NodeKind.TEAM: NodeKind.ORG,
    NodeKind.KEY: NodeKind.TEAM,
}


class BudgetTier(BaseModel):
    """Past ``at_fraction`` of the period's budget the node's requests drop to ``priority``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    at_fraction: float = Field(gt=0.0, le=1.0)
    priority: int = Field(ge=0, le=100)


class NodeLimits(BaseModel):
    """Limits one node sets; ``None`` means "inherit the parent's"."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rpm: int | None = Field(default=None, ge=0, description="requests per minute")
    tpm: int | None = Field(default=None, ge=0, description="tokens per minute (prompt + output)")
    max_concurrent: int | None = Field(default=None, ge=0, description="requests in flight at once")
    budget_usd: float | None = Field(default=None, ge=0.0, description="spend allowed per budget period")
    budget_period: Literal["day", "month"] = "month"
    budget_tiers: tuple[BudgetTier, ...] = ()
    priority: int | None = Field(default=None, ge=0, le=100, description="higher is served first")
    allowed_models: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _tiers_sorted(self) -> NodeLimits:
        fractions = [t.at_fraction for t in self.budget_tiers]
        if fractions != sorted(fractions):
            raise ValueError("budget_tiers must be sorted by at_fraction")
        return self


_NUMERIC = ("rpm", "tpm", "max_concurrent", "budget_usd", "priority")


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: NodeKind
    name: str
    parent_id: str | None
    limits: NodeLimits = field(default_factory=NodeLimits)
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class EffectiveLimits:
    """The limits that apply to a key: the minimum along its path (allowed models: intersection)."""

    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    priority: int
    allowed_models: frozenset[str] | None


class TenantTree:
    """An in-memory tree of nodes; the store keeps it in step with the database."""

    def __init__(self, nodes: list[Node] | None = None) -> None:
        self._nodes: dict[str, Node] = {}
        # memoised per tree (the request path asks for the same keys again and again)
        self._paths: dict[str, tuple[str, ...]] = {}
        self._path_nodes: dict[str, tuple[Node, ...]] = {}
        self._effective: dict[str, EffectiveLimits] = {}
        for node in nodes or []:
            self._nodes[node.id] = node

    def __contains__(self, node_id: str) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(f"unknown tenant node {node_id!r}") from None

    def nodes(self) -> list[Node]:
        return list(self._nodes.values())

    def children(self, node_id: str) -> list[Node]:
        return [n for n in self._nodes.values() if n.parent_id == node_id]

    def path(self, node_id: str) -> tuple[str, ...]:
        """Node ids from the root (org) down to ``node_id``."""
        cached = self._paths.get(node_id)
        if cached is not None:
            return cached
        out: list[str] = []
        cur: str | None = node_id
        while cur is not None:
            out.append(cur)
            cur = self.get(cur).parent_id
        path = self._paths[node_id] = tuple(reversed(out))
        return path

    def path_nodes(self, node_id: str) -> tuple[Node, ...]:
        """The nodes of :meth:`path`; the same tuple object until the tree changes."""
        cached = self._path_nodes.get(node_id)
        if cached is None:
            cached = self._path_nodes[node_id] = tuple(self.get(i) for i in self.path(node_id))
        return cached

    def subtree(self, node_id: str) -> set[str]:
        """``node_id`` and every node below it."""
        out = {node_id}
        frontier = [node_id]
        while frontier:
            cur = frontier.pop()
            for child in self.children(cur):
                out.add(child.id)
                frontier.append(child.id)
        return out

    def effective(self, node_id: str) -> EffectiveLimits:
        cached = self._effective.get(node_id)
        if cached is not None:
            return cached
        path = [self.get(i) for i in self.path(node_id)]

        def least(attr: str) -> int | None:
            vals = [getattr(n.limits, attr) for n in path if getattr(n.limits, attr) is not None]
            return min(vals) if vals else None

        models: frozenset[str] | None = None
        for n in path:
            if n.limits.allowed_models is not None:
                own = frozenset(n.limits.allowed_models)
                models = own if models is None else models & own
        priority = least("priority")
        eff = self._effective[node_id] = EffectiveLimits(least("rpm"), least("tpm"), least("max_concurrent"),
                                                         0 if priority is None else priority, models)
        return eff

    def check_child(self, kind: NodeKind, parent_id: str | None, limits: NodeLimits) -> None:
        """Raise ValueError when a node of ``kind`` under ``parent_id`` would get more than its parent."""
        want = PARENT_KIND[kind]
        if want is None:
            if parent_id is not None:
                raise ValueError("an org has no parent")
            return
        if parent_id is None or parent_id not in self._nodes:
            raise ValueError(f"a {kind.value} needs an existing {want.value} as parent")
        parent = self._nodes[parent_id]
        if parent.kind is not want:
            raise ValueError(f"a {kind.value}'s parent must be a {want.value}, not a {parent.kind.value}")
        for anc_id in self.path(parent_id):
            anc = self._nodes[anc_id].limits
            for attr in _NUMERIC:
                cap, mine = getattr(anc, attr), getattr(limits, attr)
                if cap is not None and mine is not None and mine > cap:
                    raise ValueError(f"{attr}={mine} exceeds the parent's {attr}={cap} ({anc_id})")
            if anc.budget_usd is not None and limits.budget_usd is not None \
                    and anc.budget_period == "day" and limits.budget_period == "month":
                raise ValueError(f"a monthly budget cannot sit under a daily one ({anc_id})")
            if anc.allowed_models is not None and limits.allowed_models is not None:
                extra = set(limits.allowed_models) - set(anc.allowed_models)
                if extra:
                    raise ValueError(f"models {sorted(extra)} are not allowed by {anc_id}")

    def check_update(self, node_id: str, limits: NodeLimits) -> None:
        """Raise ValueError when new ``limits`` would exceed the parent's or fall below a descendant's."""
        node = self.get(node_id)
        self.check_child(node.kind, node.parent_id, limits)
        trial = TenantTree(self.nodes())
        trial.put(replace(node, limits=limits))
        for desc_id in self.subtree(node_id) - {node_id}:
            desc = self._nodes[desc_id]
            trial.check_child(desc.kind, desc.parent_id, desc.limits)

    def put(self, node: Node) -> None:
        self._nodes[node.id] = node
        self._paths.clear()
        self._path_nodes.clear()
        self._effective.clear()

    def remove(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._paths.clear()
        self._path_nodes.clear()
        self._effective.clear()
