"""The guard state's contract, run against every implementation: ``LocalState`` over in-memory and
SQLite holds, and ``RedisState`` on a real redis-server. The same bucket, hold and breaker rules
whether they run in Python, SQL or Lua: each step checks everything before it charges anything,
and settle/release count once. Simulated times; nothing sleeps."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.breaker import BreakerConfig
from tokenomy.gateway.ops.tenancy import NodeLimits, TenantTree
from tokenomy.gateway.stores.guard_state import AdmitStep, Admitted, Finished, FinishStep, GuardState
from tokenomy.gateway.stores.local_state import LocalState
from tokenomy.gateway.stores.redis_state import RedisState
from tokenomy.gateway.stores.reservations import Charge, Hold, InProcessReservations, Refusal
from tokenomy.gateway.stores.reservations_sql import SqlReservations
from tokenomy.gateway.stores.shared_config import SharedStoresConfig
from tokenomy.gateway.stores.tenancy_sql import sqlite_engine

T0 = 1_800_000_000.0
KINDS = ["memory", "sql", "redis"]
OPEN = BreakerConfig(max_turns_per_session=None, repeat_limit=None)  # no breaker in the way


class NoLedger:
    """A ledger that recorded nothing (what ``RedisState`` reads to seed and reclaim) and never failed."""

    failed_at_s = None

    async def cost(self, request_id: str) -> float | None:
        return None

    async def spend_snapshot(self, since_s: dict[str, float]) -> tuple[dict[str, dict[str, float]], str]:
        return {p: {} for p in since_s}, "1:1:"

    def pop_xid(self, request_id: str) -> int | None:
        return None


def run(kind: str, request: pytest.FixtureRequest, tmp_path: Path, body: Callable[[GuardState], Awaitable[Any]],
        breaker: BreakerConfig = OPEN) -> Any:
    """Run ``body(state)`` on a fresh state of ``kind`` (Redis: its own key prefix)."""
    async def main() -> Any:
        if kind != "redis":
            holds = InProcessReservations() if kind == "memory" else SqlReservations(
                sqlite_engine(f"sqlite:///{tmp_path / 'holds.db'}"))
            return await body(LocalState(holds, breaker))
        url = request.getfixturevalue("redis_srv").url
        client = Redis.from_url(url)
        shared = SharedStoresConfig(redis_url=url, postgres_url="postgresql://unused", lease_s=2.0, token_flush=1)
        state = RedisState(client, shared, breaker, NoLedger(), TenantTree, prefix=f"t{secrets.token_hex(4)}:")
        try:
            await state.start(T0)
            return await body(state)
        finally:
            await state.aclose()
            await client.aclose()

    return asyncio.run(main())


def path(**key: Any) -> tuple[tuple[str, NodeLimits], ...]:
    return (("org", NodeLimits()), ("team", NodeLimits()), ("key", NodeLimits(**key)))


def charges(p: tuple[tuple[str, NodeLimits], ...]) -> tuple[Charge, ...]:
    return tuple((n, "2027-01") for n, _ in p)


def step(rid: str, p: tuple[tuple[str, NodeLimits], ...] = path(), *, tokens: int = 100, usd: float = 0.0,
         budgets: dict[Charge, float] | None = None, session: str | None = None, fingerprint: str | None = None,
         now: float = T0, need_usd: float = 0.0) -> AdmitStep:
    return AdmitStep(rid, p[-1][0], session, fingerprint, tokens // 2, p, tokens, Hold(rid, charges(p), usd, now + 60),
                     budgets or {}, now, need_usd)


def end(s: AdmitStep, actual_usd: float | None, actual_tokens: int = 0, undo_turn: bool = False) -> FinishStep:
    return FinishStep(s.request_id, s.key_id, s.session_id, tuple(n for n, _ in s.path), s.hold.charges, s.tokens,
                      s.hold.amount_usd, actual_usd, actual_tokens, s.now_s, undo_turn)


async def admitted(state: GuardState, s: AdmitStep) -> Admitted:
    got = await state.admit(s)
    assert isinstance(got, Admitted), got
    return got


async def refused(state: GuardState, s: AdmitStep) -> GatewayError:
    with pytest.raises(GatewayError) as e:
        await state.admit(s)
    return e.value


@pytest.mark.parametrize("kind", KINDS)
def test_a_limit_refusal_at_the_team_charges_no_node(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        p = (("org", NodeLimits()), ("team", NodeLimits(rpm=1)), ("key", NodeLimits(rpm=10, tpm=1000)))
        first = await admitted(state, step("r1", p))
        assert first.headers["x-ratelimit-remaining-requests"] == "0"  # the team's, the tightest
        e = await refused(state, step("r2", p))
        assert (e.status, e.code, e.headers["retry-after"]) == (429, "rate_limit_rpm", "60")
        assert e.headers["x-ratelimit-remaining-tokens"] == "900"  # r2's 100 tokens were not charged
        got = await admitted(state, step("r3", (("key", NodeLimits(rpm=10, tpm=1000)),)))
        assert got.headers["x-ratelimit-remaining-requests"] == "8"  # two charges on the key, not three

    run(kind, request, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_budget_refusal_takes_no_slot_token_or_turn(kind: str, request: pytest.FixtureRequest,
                                                      tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        p = path(rpm=2, max_concurrent=1)
        budgets = {("team", "2027-01"): 1.0}
        refusal = await state.admit(step("big", p, usd=1.5, budgets=budgets, session="s"))
        assert isinstance(refusal, Refusal) and refusal.charge == ("team", "2027-01")
        assert (refusal.budget_usd, refusal.spent_usd, refusal.reserved_usd) == (1.0, 0.0, 0.0)
        assert await state.usage(charges(p)) == [(0.0, 0.0)] * 3
        assert await state.session_spend_usd("key", "s") == 0.0
        got = await admitted(state, step("ok", p, usd=0.6, budgets=budgets, session="s"))  # the one slot was free
        assert got.headers["x-ratelimit-remaining-requests"] == "1"  # the refused request took no RPM
        assert got.spent_usd == (0.0, 0.0, 0.0)
        assert await state.usage(charges(p)) == [(0.0, 0.6)] * 3  # counted on every node, budgeted or not
        assert await state.session_spend_usd("key", "s") == pytest.approx(0.6)

    run(kind, request, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_settle_and_release_count_once(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        p = path(tpm=1000, max_concurrent=2)
        budgets = {("key", "2027-01"): 1.0}
        a, b = step("a", p, tokens=400, usd=0.5, budgets=budgets), step("b", p, tokens=400, usd=0.3, budgets=budgets)
        await admitted(state, a)
        await admitted(state, b)
        e = await refused(state, step("c", p))
        assert e.code == "concurrency_limit"
        done = await state.finish(end(a, 0.2, actual_tokens=150))
        assert done.hold is not None and done.hold.amount_usd == 0.5 and done.spent_usd[("key", "2027-01")] == 0.2
        assert await state.finish(end(a, 0.2, actual_tokens=150)) == Finished(None)  # a retry changes nothing
        assert (await state.finish(end(b, None))).hold is not None  # released: no cost, TPM refunded
        assert await state.finish(end(b, None)) == Finished(None)
        assert await state.usage([("key", "2027-01")]) == [(pytest.approx(0.2), pytest.approx(0.0))]
        got = await admitted(state, step("d", p, tokens=100))
        assert got.headers["x-ratelimit-remaining-tokens"] == "750"  # 1000 - 150 actual - 100: corrected once
        await admitted(state, step("e", p, tokens=100))  # both slots came back, once each
        assert (await refused(state, step("f", p))).code == "concurrency_limit"

    run(kind, request, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_id_holding_already_is_refused_and_charged_once(kind: str, request: pytest.FixtureRequest,
                                                                  tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        p = path(rpm=10, max_concurrent=2)
        await admitted(state, step("r1", p, usd=0.1))
        e = await refused(state, step("r1", p, usd=0.1))
        assert (e.status, e.code) == (409, "duplicate_request_id")
        await admitted(state, step("r2", p))  # the refused duplicate took no slot
        assert await state.usage([("key", "2027-01")]) == [(0.0, 0.1)]

    run(kind, request, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_200_racing_admissions_fit_a_50_request_budget_exactly(kind: str, request: pytest.FixtureRequest,
                                                              tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        budgets = {("key", "2027-01"): 0.5}

        async def one(i: int) -> bool:
            got = await state.admit(step(f"r{i}", usd=0.01, budgets=budgets))
            return isinstance(got, Admitted)

        assert sum(await asyncio.gather(*(one(i) for i in range(200)))) == 50
        spent, held = (await state.usage([("key", "2027-01")]))[0]
        assert (spent, round(held, 9)) == (0.0, 0.5)

    run(kind, request, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_turn_cap_and_repetition_refuse_and_count_nothing(kind: str, request: pytest.FixtureRequest,
                                                          tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        p = path(max_concurrent=5)
        for i in range(3):
            await admitted(state, step(f"t{i}", p, session="s1", fingerprint=f"fp{i}"))
        e = await refused(state, step("t3", p, session="s1"))
        assert (e.code, e.headers["retry-after"]) == ("breaker_turn_cap", "60")
        await admitted(state, step("x", p))  # the refused turn took no slot: 4 of 5
        await admitted(state, step("y", p))
        await admitted(state, step("u0", session="s2", fingerprint="same"))
        e = await refused(state, step("u1", session="s2", fingerprint="same"))  # the 2nd in a row
        assert e.code == "breaker_repetition" and "repeated 2 times" in e.message
        assert [(t.scope, t.subject, t.code) for t in state.drain_trips()] == [
            ("session", "s1", "breaker_turn_cap"), ("session", "s2", "breaker_repetition")]
        assert state.drain_trips() == []

    run(kind, request, tmp_path, body, BreakerConfig(max_turns_per_session=3, repeat_limit=2))


@pytest.mark.parametrize("kind", KINDS)
def test_an_undone_admission_is_no_turn(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        shed = step("shed", session="s")
        await admitted(state, shed)
        await state.finish(end(shed, None, undo_turn=True))  # shed from the queue after admission
        await admitted(state, step("served", session="s"))
        assert (await refused(state, step("third", session="s"))).code == "breaker_turn_cap"

    run(kind, request, tmp_path, body, BreakerConfig(max_turns_per_session=1))


@pytest.mark.parametrize("kind", KINDS)
def test_a_session_budget_counts_worst_cases_then_actual_costs(kind: str, request: pytest.FixtureRequest,
                                                               tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        a = step("a", usd=0.6, session="s")
        await admitted(state, a)
        assert await state.session_spend_usd("key", "s") == pytest.approx(0.6)
        e = await refused(state, step("b", usd=0.1, session="s", need_usd=0.35))  # $0.3 left < $0.35 needed
        assert e.code == "breaker_session_budget"
        await state.finish(end(a, 0.2))
        assert await state.session_spend_usd("key", "s") == pytest.approx(0.2)

    run(kind, request, tmp_path, body, BreakerConfig(session_budget_usd=0.9, max_turns_per_session=None,
                                                     cooldown_s=1.0))


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_tokens_past_the_velocity_cap_cut_the_stream_and_open_the_key(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        await admitted(state, step("r1", tokens=800))  # 400 prompt tokens in the window
        assert state.stream_tokens("r1", "key", None, 500, T0 + 1)
        await state.drain()
        state.stream_tokens("r1", "key", None, 200, T0 + 2)  # 1100 > 1000 a minute
        await state.drain()
        assert not state.stream_tokens("r1", "key", None, 0, T0 + 2)
        assert (await refused(state, step("r2", now=T0 + 3))).code == "breaker_velocity"
        assert [t.code for t in state.drain_trips()] == ["breaker_velocity"]
        assert await state.key_tokens_per_s("key", T0 + 61.5) == pytest.approx(200 / 60)  # the rest left the window

    run(kind, request, tmp_path, body, BreakerConfig(key_tokens_per_min=1000, cooldown_s=10.0))


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_over_a_whole_minute_of_tpm_never_fits(kind: str, request: pytest.FixtureRequest,
                                                         tmp_path: Path) -> None:
    async def body(state: GuardState) -> None:
        p = path(tpm=100, max_concurrent=1)
        e = await refused(state, step("big", p, tokens=160))
        assert e.code == "tokens_over_limit" and "retry-after" not in e.headers
        await admitted(state, step("small", p, tokens=60))  # no slot, no token was taken

    run(kind, request, tmp_path, body)
