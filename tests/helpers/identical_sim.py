"""Fixed-seed simulations whose results must not change when the simulator is made faster.

Each case is a small ``tokenomy sim`` run (an experiment spec and one deployment at one split);
its result is the JSON ``tokenomy sim`` writes for that deployment (``RunResult.to_dict()``:
every metric of the summary, the KV network's traffic, the simulated end), less ``wall_s``.
``tests/sim/fixtures/identical_summaries.json`` holds the results of commit 1728e6a (the
simulator before its speed work); ``tests/sim/test_identical_results.py`` compares today's
code to them. Regenerate (only when a change of results is intended, and say so in the commit):

    PYTHONPATH=src python tests/helpers/identical_sim.py --write tests/sim/fixtures/identical_summaries.json

Run with another checkout's ``src`` on ``PYTHONPATH`` to write that commit's results.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenomy.core import SLO
from tokenomy.experiment.jobs import Job, run_job
from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec

MOONCAKE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"
RTOL = 1e-9


@dataclass(frozen=True)
class Case:
    workload: WorkloadSpec
    cluster: ClusterSpec
    deployment: str  # a variant, optionally @P:D
    slo: SLO = SLO()
    needs_trace: bool = False

    def run(self) -> dict[str, Any]:
        dep = DeploymentSpec.parse(self.deployment)
        spec = ExperimentSpec(workload=self.workload, cluster=self.cluster, deployments=(dep,), slo=self.slo)
        result = run_job(spec, Job(dep, spec.splits_of(dep)[0], None)).to_dict()
        result.pop("wall_s")
        return result


def _w(source: str, rate: float, duration: float, seed: int = 0, **kw: Any) -> WorkloadSpec:
    return WorkloadSpec(source, rate_per_s=rate, duration_s=duration, seed=seed, **kw)


GAIA = _w("gaia", 4.0, 45.0, seed=3)  # near point (a)'s knee: memory pressure, deferrals, moves
H100_8 = ClusterSpec(gpus="h100:8", gpus_per_node=8)

CASES: dict[str, Case] = {
    # colocated
    "colocated_chat": Case(_w("chat", 20.0, 40.0, seed=1), ClusterSpec(instances=2), "colocated"),
    "colocated_affinity_toolbench": Case(_w("toolbench", 8.0, 20.0, seed=2), ClusterSpec(instances=4),
                                         "colocated-affinity"),
    "colocated_offload_gaia": Case(GAIA, H100_8, "colocated-offload", SLO(2.0, 0.1)),
    "colocated_horizon_gaia": Case(GAIA, ClusterSpec(instances=2, horizon_s=25.0), "colocated"),
    "colocated_admission_chat": Case(_w("chat", 10.0, 30.0, seed=4, tenants="gold:0.2,silver:0.3,free:0.5"),
                                     ClusterSpec(instances=2, admission="tier_wfq", max_in_flight=16), "colocated"),
    "colocated_mooncake": Case(WorkloadSpec(str(MOONCAKE), max_sessions=400), ClusterSpec(instances=2),
                               "colocated", needs_trace=True),
    # PD disaggregated
    "disagg_gaia": Case(GAIA, H100_8, "disagg@3:5", SLO(2.0, 0.1)),
    "disagg_offload_gaia": Case(GAIA, H100_8, "disagg-offload@5:3", SLO(2.0, 0.1)),
    "disagg_timeout_gaia": Case(GAIA, ClusterSpec(gpus="h100:8", kv_transfer_timeout_s=0.05), "disagg@2:6"),
    # AMPD (the default, its forward-bank option) and its ITL-bound ablation (no TPOT bank, no moves)
    "ampd_gaia_1_7": Case(GAIA, H100_8, "ampd@1:7", SLO(2.0, 0.1)),
    "ampd_forward_bank_gaia": Case(GAIA, H100_8, "ampd-forward-bank@1:7", SLO(2.0, 0.1)),
    "ampd_itl_bound_gaia": Case(GAIA, H100_8, "ampd-itl-bound", SLO(2.0, 0.1)),
    "ampd_itl_bound_gaia_1_7": Case(GAIA, H100_8, "ampd-itl-bound@1:7", SLO(2.0, 0.1)),
    "ampd_itl_bound_gaia_0_8": Case(GAIA, H100_8, "ampd-itl-bound@0:8", SLO(2.0, 0.1)),
    "ampd_binding_placement_gaia": Case(GAIA, H100_8, "ampd-binding-placement@2:6", SLO(2.0, 0.1)),
    # heterogeneous inventories
    "hetero_colocated_toolbench": Case(_w("toolbench", 16.0, 15.0, seed=5), ClusterSpec(gpus="h100:4,h20:4"),
                                       "colocated", SLO(2.0, 0.1)),
    "hetero_disagg_toolbench": Case(_w("toolbench", 16.0, 15.0, seed=5), ClusterSpec(gpus="h100:4,h20:4"),
                                    "disagg@2:6", SLO(2.0, 0.1)),
    "hetero_ampd_itl_bound_toolbench": Case(_w("toolbench", 16.0, 15.0, seed=5), ClusterSpec(gpus="h100:4,h20:4"),
                                            "ampd-itl-bound@1:7", SLO(2.0, 0.1)),
    "hetero_ampd_itl_bound_coding_70b": Case(_w("coding-agent", 0.1, 300.0, seed=6),
                                             ClusterSpec(model="llama-3.1-70b", gpus="h100:4@tp4,h20:8@tp4",
                                                         gpus_per_node=8),
                                             "ampd-itl-bound", SLO(10.0, 0.1)),
    "hetero_disagg_offload_coding_70b": Case(_w("coding-agent", 0.1, 300.0, seed=6),
                                             ClusterSpec(model="llama-3.1-70b", gpus="h100:4@tp4,h20:8@tp4",
                                                         gpus_per_node=8),
                                             "disagg-offload", SLO(10.0, 0.1)),
}


def differences(expected: Any, actual: Any, path: str = "", rtol: float = RTOL) -> list[str]:
    """Where ``actual`` differs from ``expected`` (numbers within ``rtol`` relative count as equal)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{path}.{k}: missing" for k in expected if k not in actual]
        out += [f"{path}.{k}: unexpected" for k in actual if k not in expected]
        for k in expected:
            if k in actual:
                out += differences(expected[k], actual[k], f"{path}.{k}", rtol)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: length {len(actual)} != {len(expected)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True)) for d in differences(e, a, f"{path}[{i}]", rtol)]
    numbers = (int, float)
    if isinstance(expected, numbers) and isinstance(actual, numbers) and not isinstance(expected, bool):
        if expected == actual or math.isclose(expected, actual, rel_tol=rtol, abs_tol=0.0):
            return []
        return [f"{path}: {actual!r} != {expected!r}"]
    return [] if expected == actual else [f"{path}: {actual!r} != {expected!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", type=Path, required=True, help="write every case's result here (JSON)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = ap.parse_args()
    names = args.cases.split(",") if args.cases else list(CASES)
    if any(CASES[n].needs_trace for n in names) and not MOONCAKE.exists():
        print(f"the Mooncake trace is needed and absent: {MOONCAKE}", file=sys.stderr)
        return 2
    import time

    out = {}
    for name in names:
        t0 = time.process_time()
        out[name] = CASES[name].run()
        print(f"{name}: {time.process_time() - t0:.1f} CPU s, attainment {out[name]['slo_attainment']}",
              file=sys.stderr)
    args.write.parent.mkdir(parents=True, exist_ok=True)
    args.write.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
