"""When decode KV binds, more prefill instances lower capacity, and the planner says so.

Requests with 6-10k-token prompts and 1.5-2.5k-token answers: prefill is light, but every
running answer holds ~10k tokens of KV on its decode instance for a minute. On 4 GPUs,
moving one GPU from decode to prefill (1P:3D -> 2P:2D) makes decode KV overflow in the
simulator (preemptions, SLO misses); the planner keeps one prefill instance and explains
that decode KV binds.
"""

from __future__ import annotations

import numpy as np

from tokenomy.core import SLO, Session, Turn
from tokenomy.plan import PlanRequest, plan, workload_stats
from tokenomy.sim import SimConfig, simulate

RATE_PER_S = 2.0
DURATION_S = 150.0


def _sessions() -> list[Session]:
    rng = np.random.default_rng(0)
    t, out = 0.0, []
    while True:
        t += rng.exponential(1 / RATE_PER_S)
        if t >= DURATION_S:
            return out
        p, o = int(rng.integers(6000, 10000)), int(rng.integers(1500, 2500))
        out.append(Session(f"s{len(out)}", t, (Turn(p, o, content=((len(out) + 1, p + o),)),)))


def test_adding_prefill_lowers_capacity_and_the_planner_does_not_add_it() -> None:
    sessions = _sessions()
    slo = SLO()
    attained = {}
    for prefill, decode in ((1, 3), (2, 2)):
        config = SimConfig(deployment="disagg", prefill=prefill, decode=decode, horizon_s=DURATION_S + 60)
        result = simulate(sessions, config, slo)
        attained[prefill] = (result.summary.slo_attainment, sum(r.preemptions for r in result.records))
    assert attained[1][0] >= 0.95 and attained[1][1] == 0, attained
    assert attained[2][0] < attained[1][0] - 0.1 and attained[2][1] > 0, attained  # KV overflow: preemptions

    stats = workload_stats("long-answers", sessions, RATE_PER_S)
    request = PlanRequest("llama-3.1-8b", {"H100-SXM": 4}, slo, tp_choices=(1,), modes=("disagg",))
    result = plan(stats, request)
    pools = {o.candidate.role: o.count for o in result.chosen}
    assert pools == {"prefill": 1, "decode": 3}
    assert result.binding.startswith("decode KV binds"), result.binding
    assert "adding prefill would not help" in result.binding and "KV overflows" in result.binding
