"""EAAS failover benchmark: SIGKILL one expert server mid-stream, every expert on 2 servers.

Prints throughput before, during (recovery window) and after the kill, the drop over the recovery
window, and lost / wrong tokens against the monolithic reference. With ``--repeats N`` the run is
repeated and the JSON reports the run with the median drop (all runs under ``runs``).

    python benchmarks/eaas_failover.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from tokenomy.eaas.failover import FailoverConfig, run_failover


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8.0, help="stream duration per run")
    p.add_argument("--kill-at", type=float, default=4.0, help="seconds into the stream")
    p.add_argument("--recovery-window", type=float, default=1.0, help="seconds after the kill counted as 'during'")
    p.add_argument("--batch-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=0.5, help="per-request timeout, seconds")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--control", action="store_true",
                   help="also run the same windows without a kill, to show the measurement's noise floor")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = p.parse_args()
    cfg = FailoverConfig(n_servers=args.servers, replicas=args.replicas, duration_s=args.seconds,
                         kill_at_s=args.kill_at, recovery_window_s=args.recovery_window,
                         batch_tokens=args.batch_tokens, timeout_s=args.timeout)
    runs, controls = [], []
    for i in range(max(1, args.repeats)):
        r = run_failover(cfg)
        runs.append(r.to_json())
        print(f"run {i}: before {r.throughput_before_tps:.0f} tok/s, during {r.throughput_during_tps:.0f}, "
              f"after {r.throughput_after_tps:.0f}, drop {100 * r.drop_fraction:.2f}%, lost {r.lost_tokens}, "
              f"wrong {r.wrong_tokens}, resent groups {r.failovers}, longest stall in window "
              f"{1000 * r.max_gap_in_window_s:.1f} ms (typical batch {1000 * r.median_gap_s:.1f} ms)", flush=True)
        if args.control:
            c = run_failover(replace(cfg, kill=False))
            controls.append(c.to_json())
            print(f"  control (no kill): drop {100 * c.drop_fraction:.2f}%, longest stall in window "
                  f"{1000 * c.max_gap_in_window_s:.1f} ms", flush=True)
    median_drop = statistics.median(r["drop_fraction"] for r in runs)
    chosen = min(runs, key=lambda r: abs(r["drop_fraction"] - median_drop))
    out = dict(chosen, median_drop_fraction=median_drop, runs=runs, control_runs=controls,
               lost_tokens=sum(r["lost_tokens"] for r in runs), wrong_tokens=sum(r["wrong_tokens"] for r in runs))
    print(f"throughput_before_tps {out['throughput_before_tps']:.0f}  throughput_during_tps "
          f"{out['throughput_during_tps']:.0f}  throughput_after_tps {out['throughput_after_tps']:.0f}  "
          f"drop_fraction {out['drop_fraction']:.4f}  lost_tokens {out['lost_tokens']}  "
          f"wrong_tokens {out['wrong_tokens']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["lost_tokens"] == 0 and out["wrong_tokens"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
