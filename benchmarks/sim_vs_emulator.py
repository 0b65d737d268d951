"""Fidelity: the same agent workload through ``tokenomy sim`` and, live, through ``tokenomy bench``
against ``tokenomy up`` with the same configuration.

A GAIA-like workload (``--rate`` sessions/s over ``--duration`` s, a few hundred turns) on
``--instances`` mixed Llama-3.1-8B / H100 instances with the simulator's engine defaults. Session
i is pinned to instance ``i mod instances`` in both runs: the bench pins sessions that way, and the
simulation runs one single-instance simulation per instance on that instance's sessions, then
summarises the union of their records (colocated instances share nothing but the router, so this
is the same cluster with the bench's routing). The live run uses /v1/completions so the emulator
sees exactly the workload's token counts, and runs the emulator with its default ``max_lag_ms=20`` (``--max-lag-ms`` changes it; docs/bench.md). Writes ``{"ttft_p50": [sim, live], "ttft_p99": ...,
"tpot_p50", "tpot_p99", "slo_attainment", "cached_fraction"}`` plus the targets of issue 8 (P50s
within 15%, P99s within 30%, attainment within 0.05) and whether each was met.

    python benchmarks/sim_vs_emulator.py --json out/sim_vs_emulator.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _emulated import cluster
from _fidelity import Tolerance, compare, report

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import SLO, RequestRecord, Session
from tokenomy.metrics import Summary, summarize
from tokenomy.metrics.report import render_table
from tokenomy.sim import SimConfig, simulate
from tokenomy.workload.registry import load_workload

TOLERANCE: Tolerance = {"ttft_p50": ("rel", 0.15), "ttft_p99": ("rel", 0.30), "tpot_p50": ("rel", 0.15),
                        "tpot_p99": ("rel", 0.30), "slo_attainment": ("abs", 0.05)}
"""Issue 8's targets, relative to the simulated value."""


def simulated(sessions: list[Session], args: argparse.Namespace, slo: SLO) -> Summary:
    records: list[RequestRecord] = []
    end = 0.0
    for k in range(args.instances):
        mine = [s for i, s in enumerate(sessions) if i % args.instances == k]
        if not mine:
            continue
        config = SimConfig(deployment="colocated", model=args.model, gpu=args.gpu, instances=1)
        result = simulate(mine, config, slo)
        records += result.records
        end = max(end, result.sim_end_s)
    return summarize(records, slo=slo, duration_s=max(end, 1e-9), num_gpus=args.instances, usd_per_gpu_hour=0.0)


def live(sessions: list[Session], args: argparse.Namespace, slo: SLO) -> tuple[Summary, dict[str, Any]]:
    if args.max_lag_ms is None:  # (only when called as a library with None: the emulator's default)
        up_args = ["--instances", str(args.instances), "--model", args.model, "--gpu", args.gpu,
                   "--max-model-len", str(args.max_model_len)]
    else:  # `tokenomy up` takes the emulator's lag tolerance from a cluster file only
        spec = {"model": args.model, "gpu": args.gpu, "pools": [{"role": "mixed", "count": args.instances}],
                "engine": {"max_model_len": args.max_model_len, "max_lag_ms": args.max_lag_ms}}
        path = Path(tempfile.mkdtemp()) / "cluster.yaml"
        path.write_text(json.dumps(spec))  # JSON is YAML
        up_args = [str(path)]
    with cluster(up_args) as urls:
        config = BenchConfig(targets=tuple(urls), model=args.model, api="completions", slo=slo,
                             gpus=args.instances, seed=args.seed)
        rep = run_bench(sessions, config)
    return rep.summary, {"errors_by_status": rep.errors_by_status, **rep.extras}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=0.3, help="GAIA sessions per second")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of session arrivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--max-model-len", type=int, default=131072, help="emulator context window (GAIA grows long)")
    ap.add_argument("--max-lag-ms", type=float, default=20.0,
                    help="emulator's tolerance for falling behind the model (default 20, the emulator's own); "
                         "a larger value (e.g. 100) hides a CPU-starved machine's parsing and tokenizing "
                         "from the modelled TTFT")
    ap.add_argument("--slo-ttft", type=float, default=SLO().ttft_s)
    ap.add_argument("--slo-tpot", type=float, default=SLO().tpot_s)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.instances < 1:
        print("sim_vs_emulator: --instances must be >= 1", file=sys.stderr)
        return 2
    slo = SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)
    sessions = load_workload("gaia", rate_per_s=args.rate, duration_s=args.duration, seed=args.seed)
    turns = sum(len(s.turns) for s in sessions)
    print(f"gaia: {len(sessions)} sessions, {turns} turns, {args.instances} instance(s)", flush=True)
    sim = simulated(sessions, args, slo)
    print(f"simulated: {sim.requests} requests, TTFT P50 {sim.ttft_p50_s}", flush=True)
    got, extras = live(sessions, args, slo)
    render_table({"sim": sim, "emulator": got}, title="sim vs emulator (gaia)")
    out = compare(sim, got, TOLERANCE, relative_to="sim")
    out.update({"requests": [sim.requests, got.requests], "live": extras,
                "config": {k: v for k, v in vars(args).items() if k != "json"} | {"json": None}})
    report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
