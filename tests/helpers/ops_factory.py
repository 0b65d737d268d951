"""Factories for token-operations tests: a guard on a temporary SQLite file and a fake clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenomy.gateway.ops.build import build_guard
from tokenomy.gateway.ops.guard import AdmitRequest
from tokenomy.gateway.ops.ops_guard import OpsGuard
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits

SECRET = "s" * 32
T0 = 1_795_000_000.0  # 2026-11-18 UTC, mid-month and mid-day


class FakeClock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt_s: float) -> None:
        self.t += dt_s


@dataclass(frozen=True)
class FlatPrice:
    input_per_mtok: float = 1.0
    cached_input_per_mtok: float = 0.25
    output_per_mtok: float = 2.0


@dataclass
class FakeConfig:
    ops: dict[str, Any] = field(default_factory=dict)

    def price(self, model: str) -> FlatPrice:
        return FlatPrice()


def make_guard(tmp_path: Path, clock: FakeClock | None = None, **ops: Any) -> OpsGuard:
    ops.setdefault("server_secret", SECRET)
    return build_guard(FakeConfig(ops), db_url=f"sqlite:///{tmp_path / 'ops.db'}", clock=clock or FakeClock())


def add_key(guard: OpsGuard, org: NodeLimits | None = None, team: NodeLimits | None = None,
            key: NodeLimits | None = None, org_name: str = "acme") -> tuple[str, str]:
    """An org/team/key chain; returns (raw key, key node id)."""
    store = guard.store
    o = store.create_node(NodeKind.ORG, org_name, None, org)
    t = store.create_node(NodeKind.TEAM, "team", o.id, team)
    node, raw = store.create_key(t.id, "key", key)
    return raw, node.id


def request(key: str | None, rid: str, model: str = "m", prompt: int = 100, max_tokens: int = 100,
            session: str | None = None, fingerprint: str | None = None, retries: int = 0) -> AdmitRequest:
    return AdmitRequest(rid, key, model, prompt, max_tokens, session_id=session, prompt_fingerprint=fingerprint,
                        retries=retries)
