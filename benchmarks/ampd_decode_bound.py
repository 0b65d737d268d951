"""An upper bound on the sessions/s a pool can decode within the TPOT SLO (docs/ampd-results.md).

Each decode instance of the pool runs at most ``max_B B / T(B)`` output tokens per second with
``T(B) <= tpot`` (``T``: the performance model's decode step of ``B`` sequences at the workload's
mean decode context, nothing else in the step: no prefill chunk, no preemption), capped at
``max_num_seqs``. The pool's sum over the workload's output tokens per session bounds the
session rate it can serve in steady state, whatever the scheduler does. Prefill work only
lowers it (for a colocated pool, whose GPUs also prefill, the bound is looser still).

    python benchmarks/ampd_decode_bound.py --workload toolbench --model llama-3.1-8b \\
        --pool h20:4 --pool h100:4,h20:4 --tpot 0.1 --json out/decode_bound_d.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tokenomy.perf.inventory import parse_gpus
from tokenomy.perf.model import PerfModel
from tokenomy.workload import load_workload


def instance_tokens_per_s(perf: PerfModel, mean_context: float, tpot_s: float, max_seqs: int) -> tuple[float, int]:
    """(most output tokens/s one instance decodes with every step within ``tpot_s``, at batch)."""
    best, at = 0.0, 0
    for b in range(1, max_seqs + 1):
        t = perf.decode_step_time_s(b, mean_context)
        if t > tpot_s:
            break
        if b / t > best:
            best, at = b / t, b
    return best, at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pool", action="append", required=True, help="a decode pool, e.g. h20:4 or h20:8@tp4")
    ap.add_argument("--tpot", type=float, required=True)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sessions = load_workload(args.workload, rate_per_s=10.0, duration_s=200.0, seed=0)
    turns = [t for s in sessions for t in s.turns]
    out_per_session = sum(t.output_tokens for t in turns) / len(sessions)
    # a decode step sees each sequence at its prompt plus, on average, half its output
    mean_context = float(np.mean([t.prompt_tokens + t.output_tokens / 2 for t in turns]))
    rows = []
    for pool_text in args.pool:
        total, parts = 0.0, []
        for pool in parse_gpus(pool_text):
            perf = PerfModel.from_names(args.model, pool.gpu, pool.tp)
            tok, batch = instance_tokens_per_s(perf, mean_context, args.tpot, args.max_num_seqs)
            total += tok * pool.instances
            parts.append({"pool": pool.label, "tokens_per_s_per_instance": round(tok), "batch": batch})
        rows.append({"decode_pool": pool_text, "parts": parts, "tokens_per_s": round(total),
                     "sessions_per_s_bound": round(total / out_per_session, 2)})
    report = {"workload": args.workload, "model": args.model, "tpot_s": args.tpot,
              "output_tokens_per_session": round(out_per_session, 1), "mean_decode_context": round(mean_context),
              "pools": rows}
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
