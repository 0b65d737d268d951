"""How fast does the planner solve a large heterogeneous inventory?

128 GPUs of two types (64 H100 + 64 H20 by default), TP 1/2/4/8 per type, so 8 instance
shapes per role (prefill, decode, mixed); every (shape, count) within the inventory is an
option of the MILP. Reports the MILP solve time (HiGHS), the whole ``plan()`` time (pricing
every workload sample for every shape, runner-up and colocated alternative included) and the
chosen topology. Uncalibrated: calibration is cached separately and does not change the solve.

    python benchmarks/plan_speed.py --json OUT

Writes ``{"gpus", "configs", "solve_s", ...}``; ``configs`` counts instance shapes per role.
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
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
