"""The MILP and the planner's choices: inventory, node size, objectives, modes, explanations."""

from __future__ import annotations

import pytest

from tokenomy.plan import Candidate, PlanRequest, plan, workload_stats
from tokenomy.plan.milp import solve
from tokenomy.plan.options import Option
from tokenomy.plan.queueing import Prediction
from tokenomy.plan.stats import WorkloadStats
from tokenomy.workload.registry import load_workload


@pytest.fixture(scope="module")
def chat() -> WorkloadStats:
    return workload_stats("chat", load_workload("chat", rate_per_s=10, duration_s=60, seed=0), 10)


def _opt(role: str, gpu: str, tp: int, count: int, score: float, attainment: float = 1.0) -> Option:
    p = Prediction(None, None, 0.5, 0.0, 0.0, True, ttft_attainment=attainment)
    return Option(Candidate(role, gpu, tp), count, p, score)


def test_p95_objective_minimises_the_worst_role_within_the_inventory() -> None:
    # prefill P95 falls with its count, decode's too; 4 GPUs: the best split is 2:2 (max 0.5).
    opts = [_opt("prefill", "H100-SXM", 1, k, {1: 2.0, 2: 0.5, 3: 0.4}[k]) for k in (1, 2, 3)]
    opts += [_opt("decode", "H100-SXM", 1, k, {1: 0.9, 2: 0.45, 3: 0.3}[k]) for k in (1, 2, 3)]
    best = solve(opts, {"H100-SXM": 4}, "p95")
    assert best is not None and best.z == 0.5
    assert {(o.candidate.role, o.count) for o in best.chosen} == {("prefill", 2), ("decode", 2)}
    runner = solve(opts, {"H100-SXM": 4}, "p95", exclude=[best.chosen])
    assert runner is not None and runner.z == 0.9  # 3:1 (the other split that fits)
    assert solve(opts, {"H100-SXM": 1}, "p95") is None  # a P/D pair needs two GPUs


def test_cost_objective_takes_the_cheapest_choice_within_the_slos() -> None:
    opts = [_opt("mixed", "H100-SXM", 1, 1, 1.3, 0.7), _opt("mixed", "H100-SXM", 1, 2, 0.8, 0.95),
            _opt("mixed", "H100-SXM", 1, 4, 0.3, 0.99)]
    best = solve(opts, {"H100-SXM": 8}, "cost", target=0.9)
    assert best is not None and [o.count for o in best.chosen] == [2]  # 1 misses the target, 4 costs more
    assert solve(opts, {"H100-SXM": 8}, "p95").chosen[0].count == 4  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="needs an attainment target"):
        solve(opts, {"H100-SXM": 8}, "cost")


def test_feasibility_is_the_product_of_the_roles_attainments() -> None:
    # P95 prefers 2:2 (max score 0.5) but it attains 0.92 * 0.95 = 0.874 < 0.9; 3:1 attains 0.99 * 0.93.
    opts = [_opt("prefill", "H100-SXM", 1, 2, 0.5, 0.92), _opt("prefill", "H100-SXM", 1, 3, 0.6, 0.99)]
    opts += [_opt("decode", "H100-SXM", 1, 2, 0.45, 0.95), _opt("decode", "H100-SXM", 1, 1, 0.9, 0.93)]
    assert {o.count for o in solve(opts, {"H100-SXM": 4}, "p95").chosen} == {2}  # type: ignore[union-attr]
    best = solve(opts, {"H100-SXM": 4}, "p95", target=0.9)
    assert best is not None and [(o.candidate.role, o.count) for o in best.chosen] == [("prefill", 3), ("decode", 1)]
    assert best.attainment == pytest.approx(0.99 * 0.93)
    assert solve(opts, {"H100-SXM": 4}, "p95", target=0.95) is None


def test_heterogeneous_pools_respect_type_inventory_and_node_size(chat: WorkloadStats) -> None:
    inventory = {"H100-SXM": 8, "H20": 8}
    result = plan(chat, PlanRequest("llama-3.1-8b", inventory, gpus_per_node=4))
    for gpu, n in inventory.items():
        assert sum(o.gpus for o in result.chosen if o.candidate.gpu == gpu) <= n
    assert all(o.candidate.tp <= 4 for o in result.chosen)
    assert result.solution.z <= 1.0 and result.binding


def test_cost_plan_is_no_dearer_and_p95_plan_no_slower(chat: WorkloadStats) -> None:
    inventory = {"H100-SXM": 8}
    fast = plan(chat, PlanRequest("llama-3.1-8b", inventory, objective="p95"))
    cheap = plan(chat, PlanRequest("llama-3.1-8b", inventory, objective="cost"))
    assert cheap.solution.usd_per_hour <= fast.solution.usd_per_hour
    assert fast.solution.z <= cheap.solution.z <= 1.0


def test_a_single_gpu_cannot_disaggregate_and_the_plan_says_so(chat: WorkloadStats) -> None:
    result = plan(chat.scaled(0.5), PlanRequest("llama-3.1-8b", {"H100-SXM": 1}))
    assert [o.candidate.role for o in result.chosen] == ["mixed"]
    assert "do not disaggregate" in result.binding


def test_modes_restrict_the_choice(chat: WorkloadStats) -> None:
    only_disagg = plan(chat, PlanRequest("llama-3.1-8b", {"H100-SXM": 4}, modes=("disagg",)))
    assert {o.candidate.role for o in only_disagg.chosen} == {"prefill", "decode"}
    only_mixed = plan(chat, PlanRequest("llama-3.1-8b", {"H100-SXM": 4}, modes=("mixed",)))
    assert {o.candidate.role for o in only_mixed.chosen} == {"mixed"}
    with pytest.raises(ValueError, match="modes"):
        PlanRequest("llama-3.1-8b", {"H100-SXM": 4}, modes=("both",))


def test_p95_grows_with_load_until_the_instance_is_refused(chat: WorkloadStats) -> None:
    from tokenomy.plan.options import EngineLimits, build_models

    models, _ = build_models("llama-3.1-8b", {"H100-SXM": 1}, chat, EngineLimits(), 8)
    for cand, model in models.items():
        values = []
        for rate in (0.5, 2, 8, 32, 128, 512):
            p = model.predict(rate)
            if not p.feasible:
                assert p.reason
                break
            values.append(p.ttft_p95_s if cand.role != "decode" else p.tpot_p95_s)
        assert values == sorted(values), (cand, values)
        assert not model.predict(10_000).feasible, cand
        floor = model.zero_load()
        assert (floor.ttft_p95_s or floor.tpot_p95_s or 0) <= values[0] + 1e-9
