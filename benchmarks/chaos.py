"""A chaos run of the whole fleet, audited: 3 gateway replicas on one Redis and one PostgreSQL, 3
emulated engines, agent load (chat, Messages, Responses) on three key tiers (no budget, a budget
never reached, a budget spent), while a seeded schedule kills replicas and engines, restarts
Redis, stops PostgreSQL for 60 s, slows PostgreSQL and an engine, and hangs up clients mid-stream,
alone and overlapping (``tokenomy.chaos``). ``--soak``: no faults, steady load (30 min default).

    python benchmarks/chaos.py --json out/chaos.json              # 10 minutes, seed 0
    python benchmarks/chaos.py --soak --json out/soak.json        # 30 minutes
    python benchmarks/chaos.py --on-client-disconnect finish --json out/chaos-finish.json  # hang-ups billed in full

Writes ``{"duration_s", "faults", "offered", "served", "lost", "duplicated",
"ledger_vs_backends_max_diff_tokens", "overspend_usd", "holds_left", "availability_by_window",
"rss_growth_pct", ...}`` and prints the windows' table (docs/gateway-ops.md, "Chaos run").
Targets (issue 32): lost, duplicated, overspend, holds left and ledger vs backends all 0;
availability over the PostgreSQL outage >= 99% (unbudgeted keys), >= 95% (budgeted); soak RSS
growth < 10% after warm-up, last 5 minutes' latency within 10% of the first 5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tokenomy.chaos.report import table
from tokenomy.chaos.run import ChaosOptions, run_chaos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--duration", type=float, default=None, help="seconds of load (default 600; --soak 1800)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault schedule and the workload")
    ap.add_argument("--soak", action="store_true", help="no faults, steady load")
    ap.add_argument("--time-scale", type=float, default=0.05, help="the emulators' --time-scale")
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs, outbox files)")
    ap.add_argument("--redis-loses-data", action="store_true",
                    help="run Redis without its append-only file: each restart empties it")
    ap.add_argument("--on-client-disconnect", choices=("cancel", "finish"), default="cancel",
                    help="the replicas' policy for a client hanging up mid-stream (default: the gateway's, cancel)")
    args = ap.parse_args(argv)
    duration = args.duration if args.duration is not None else (1800.0 if args.soak else 600.0)
    try:
        opts = ChaosOptions(duration_s=duration, seed=args.seed, soak=args.soak, time_scale=args.time_scale,
                            keep_dir=args.keep, redis_appendonly=not args.redis_loses_data,
                            on_client_disconnect=args.on_client_disconnect)
    except ValueError as e:
        ap.error(str(e))
    result = asyncio.run(run_chaos(opts, log=lambda m: print(m, file=sys.stderr, flush=True)))
    print(table(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
