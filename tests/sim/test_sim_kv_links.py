"""KV transfer as a contended resource: ports shared by concurrent transfers, timeouts, topology."""

from __future__ import annotations

import pytest

from tokenomy.core import SLO, Session, Turn
from tokenomy.core.link import SharedLink
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.link import KVFabric
from tokenomy.sim.loop import EventLoop

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def test_shared_link_n_concurrent_transfers_take_n_times_one() -> None:
    link = SharedLink(bytes_per_s=1e9)
    for k in range(4):
        link.start(0.0, 1e9, k)
    assert link.next_through_s() == pytest.approx(4.0)
    assert sorted(link.pop_through(4.0)) == [0, 1, 2, 3]
    assert link.bytes_sent == pytest.approx(4e9)


def test_shared_link_shares_bandwidth_with_a_late_arrival() -> None:
    """A 2 GB transfer alone for 1 s (1 GB left), then shared with a 0.5 GB one: the short one
    is through after 1 more second, the long one 0.5 s after that."""
    link = SharedLink(bytes_per_s=1e9)
    link.start(0.0, 2e9, "long")
    assert link.eta_s(1.0, 0.5e9) == pytest.approx(1.0)  # both move 0.5 GB before it is through
    link.start(1.0, 0.5e9, "short")
    assert link.next_through_s() == pytest.approx(2.0)
    assert link.pop_through(2.0) == ["short"]
    assert link.next_through_s() == pytest.approx(2.5)
    moved = link.cancel(2.25, "long")
    assert moved == pytest.approx(2e9 - 0.25e9)


def test_shared_link_lets_a_transfer_through_when_its_remainder_is_below_the_clock_resolution() -> None:
    """Late in a run (t = 136.6 s, the clock's resolution ~3e-14 s) a fast port (NVLink, 1.8 TB/s)
    can be left with a remainder whose time rounds to ``now``: ``next_through_s`` is ``now``, and
    ``pop_through(now)`` must let it through (a hang of `sim compare`, point (c), seed 1, before)."""
    link = SharedLink(bytes_per_s=1.8e12)
    link.start(136.0, 17039360, "t")
    link._t, link._v = 136.61989206586472, 17039359.977388814  # the state the hang was stuck in
    now = link.next_through_s()
    assert now == 136.61989206586472
    assert link.pop_through(now) == ["t"]
    assert link.next_through_s() is None


@pytest.mark.parametrize("t0", [1.0, 1e3, 1e5])
def test_shared_link_driven_as_the_fabric_drives_it_always_makes_progress(t0: float) -> None:
    """Transfers of awkward sizes on a fast port, far into a run: each wake-up at ``next_through_s``
    lets at least one transfer through (bounded: no wake-up may come back empty-handed twice)."""
    link = SharedLink(bytes_per_s=1.8e12)
    sizes = [17039360 + 7919 * k for k in range(40)]
    for k, n in enumerate(sizes):
        link.start(t0 + k * 1e-6, n, k)
    through: list[object] = []
    idle = 0
    for _ in range(4 * len(sizes)):
        nxt = link.next_through_s()
        if nxt is None:
            break
        got = link.pop_through(nxt)
        idle = 0 if got else idle + 1
        assert idle < 2, f"woke at {nxt!r} twice with nothing through"
        through += got
    assert sorted(through) == list(range(len(sizes)))  # type: ignore[type-var]


def fabric_run(n: int, timeout_s: float | None = None) -> tuple[list[float], int]:
    loop = EventLoop()
    fabric = KVFabric(loop, {"d": (1e12, 1e9)}, {"d": 1}, latency_s=0.01, timeout_s=timeout_s)
    done: list[float] = []
    cut: list[int] = []
    for k in range(n):
        fabric.send("p", "d", 1e9, 0.0, lambda: done.append(loop.now), kind="prompt_kv",
                    on_timeout=lambda k=k: cut.append(k))
    loop.run()
    return done, len(cut)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_fabric_n_concurrent_transfers_each_take_n_times_one(n: int) -> None:
    done, _ = fabric_run(n)
    assert done == pytest.approx([n * 1.0 + 0.01] * n)


def test_fabric_uses_nvlink_inside_a_node() -> None:
    loop = EventLoop()
    fabric = KVFabric(loop, {"a": (100e9, 1e9), "b": (100e9, 1e9)}, {"a": 0, "b": 0}, latency_s=0.0)
    assert fabric.eta_s("a", "b", 1e9, 0.0) == pytest.approx(0.01)
    assert fabric.eta_s(None, "b", 1e9, 0.0) == pytest.approx(1.0)


def burst(n: int, prompt: int = 6000) -> list[Session]:
    return [Session(f"s{i}", 0.0, (Turn(prompt_tokens=prompt, output_tokens=4),)) for i in range(n)]


def pd(n_prefill: int, **kw: object) -> SimConfig:
    return SimConfig(deployment="disagg", prefill=n_prefill, decode=1, router="round_robin", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [2, 4])
def test_disagg_n_simultaneous_transfers_into_one_decode_take_n_times_one(n: int) -> None:
    """N prefill instances finish the same prompt together and ship it to one decode instance:
    each transfer takes N times as long as a lone one (the setup latency once), and the
    queueing shows in the run's transfer waits."""
    alone = simulate(burst(1), pd(1), SLO(), perf=PERF).transfers
    many = simulate(burst(n), pd(n), SLO(), perf=PERF).transfers
    setup = PERF.coeffs.kv_transfer_setup_s
    one = alone.durations_s[0]
    assert one == pytest.approx(PERF.kv_transfer_time_s(6000), rel=1e-9)
    assert many.durations_s == pytest.approx([n * (one - setup) + setup] * n, rel=1e-9)
    assert many.waits_s == pytest.approx([(n - 1) * (one - setup)] * n, rel=1e-9)
    assert many.bytes_by_kind["prompt_kv"] == pytest.approx(n * 6000 * PERF.kv_bytes_per_token)


def test_transfers_that_time_out_become_incomplete_requests_counted_not_dropped() -> None:
    alone = PERF.kv_transfer_time_s(6000)
    result = simulate(burst(4), pd(4, kv_transfer_timeout_s=2.5 * alone), SLO(), perf=PERF)
    assert result.transfers.timeouts == 4
    assert len(result.records) == 4
    assert all(not r.finished and r.first_token_s is None for r in result.records)
    assert result.summary.slo_met == 0
    # one timeout-free transfer is fine
    ok = simulate(burst(1), pd(1, kv_transfer_timeout_s=2.5 * alone), SLO(), perf=PERF)
    assert ok.transfers.timeouts == 0 and ok.records[0].finished
