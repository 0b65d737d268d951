"""How fast does the planner solve a large heterogeneous inventory?

128 GPUs of two types (64 H100 + 64 H20 by default), TP 1/2/4/8 per type, so 8 instance
shapes per role (prefill, decode, mixed); every (shape, count) within the inventory is an
option of the MILP. Reports the MILP solve time (HiGHS), the whole ``plan()`` time (pricing
every workload sample for every shape, runner-up and colocated alternative included) and the
chosen topology. Uncalibrated: calibration is cached separately and does not change the solve.

    python benchmarks/plan_speed.py --json OUT
    python benchmarks/plan_speed.py --fleet --json OUT --workers 2

Writes ``{"gpus", "configs", "solve_s", ...}``; ``configs`` counts instance shapes per role.
``--fleet`` plans the issue's fleet instead, ``tokenomy plan --gpus h100:512,h20:384,a100:128
--workload coding-agent --choose`` (1,024 GPUs of three types, Llama-3.1-8B at 1 session/s): the
MILP, the whole plan, and ``--choose``'s simulations of every candidate on the planned pools
(``--workers`` processes, all at once), and writes ``{"fleet_1024": {"milp_s", "plan_s",
"choose_wall_s", "choose_cpu_s", ...}}`` (wall and this process's CPU; the workers' CPU is theirs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tokenomy.core import SLO
from tokenomy.plan import PlanRequest, plan, workload_stats
from tokenomy.workload.registry import load_workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--gpus", default="H100-SXM:64,H20:64")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--workload", default="gaia")
    ap.add_argument("--rate", type=float, default=6.0, help="sessions per second")
    ap.add_argument("--objective", default="p95")
    ap.add_argument("--fleet", action="store_true", help="the 1,024-GPU fleet with --choose (see above)")
    ap.add_argument("--workers", type=int, default=2, help="--fleet: processes for the candidates' simulations")
    ap.add_argument("--choose-duration", type=float, default=120.0, help="--fleet: seconds each candidate simulates")
    args = ap.parse_args(argv)
    if args.fleet:
        return fleet(args)
    inventory = {name: int(n) for name, n in (part.split(":") for part in args.gpus.split(","))}
    sessions = load_workload(args.workload, rate_per_s=args.rate, duration_s=300.0, seed=0)
    stats = workload_stats(args.workload, sessions, args.rate)
    request = PlanRequest(args.model, inventory, SLO(), objective=args.objective)
    t0 = time.perf_counter()
    result = plan(stats, request)
    total_s = time.perf_counter() - t0
    configs = result.candidates // 3  # the same shapes are offered to each of the three roles
    out = {
        "gpus": sum(inventory.values()),
        "gpu_types": inventory,
        "configs": configs,
        "options": result.options_considered,
        "solve_s": round(result.solution.solve_s, 4),
        "plan_s": round(total_s, 3),
        "topology": [{"role": o.candidate.role, "gpu": o.candidate.gpu, "tp": o.candidate.tp, "count": o.count}
                     for o in result.chosen],
        "score": round(result.solution.z, 4),
        "binding": result.binding,
    }
    args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


FLEET = {"H100-SXM": 512, "H20": 384, "A100-80GB": 128}


def fleet(args: argparse.Namespace) -> int:
    """The fleet point: plan, then choose by simulating every candidate on the planned pools."""
    from tokenomy.experiment.choose import choose_on, plan_topologies
    from tokenomy.experiment.spec import WorkloadSpec

    rate, workload = 1.0, "coding-agent"  # `tokenomy plan`'s defaults
    sessions = load_workload(workload, rate_per_s=rate, duration_s=600.0, seed=0)  # `plan --duration` default
    stats = workload_stats(workload, sessions, rate)
    t0 = time.perf_counter()
    result = plan(stats, PlanRequest("llama-3.1-8b", FLEET, SLO()))
    plan_s = time.perf_counter() - t0
    spec = WorkloadSpec(workload, rate_per_s=rate, duration_s=args.choose_duration, seed=0)
    t1, c1 = time.perf_counter(), time.process_time()
    choice = choose_on(plan_topologies(result, spec), rate, workers=args.workers)
    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
    out = {"fleet_1024": {
        "gpus": sum(FLEET.values()), "gpu_types": FLEET, "options": result.options_considered,
        "milp_s": round(result.solution.solve_s, 3), "plan_s": round(plan_s, 3),
        "choose_wall_s": round(wall, 2), "choose_cpu_s": round(cpu, 2), "workers": args.workers,
        "topology": [{"role": o.candidate.role, "gpu": o.candidate.gpu, "tp": o.candidate.tp, "count": o.count}
                     for o in result.chosen],
        "chosen": choice.label,
        "candidates": [{"deployment": r.deployment, "num_gpus": r.num_gpus, "slo_attainment": r.summary.slo_attainment,
                        "wall_s": round(r.wall_s, 2)} for r in choice.results],
    }}
    args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
