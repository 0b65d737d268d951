"""EAAS failover benchmark: the throughput a SIGKILLed expert server costs a generation, paired.

A tiny transformers MoE model (DeepSeek-V3 by default) generates greedily with its routed experts on
4 expert servers, every expert on 2. Each pair runs the same generation on two such deployments in
lock step (they take turns, one decode step each), one with server s0 SIGKILLed after token 16, the
other untouched (roles and order alternating); the drop is taken over the window from
the kill to the last token, split into the resent work (the step that meets the dead server) and the
lost server's capacity (the steps after it, through the median of their paired differences); the
steps before the kill give the noise floor. Every
generation is checked token for token against the monolith's own ``generate``.
See tokenomy.eaas.paired_failover for the definitions.

    python benchmarks/eaas_failover.py --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenomy.eaas.hf_models import ARCHITECTURES
from tokenomy.eaas.paired_failover import PairedFailoverConfig, run_paired_failover


def main() -> int:
    d = PairedFailoverConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=d.arch, choices=ARCHITECTURES)
    p.add_argument("--servers", type=int, default=d.n_servers)
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--pairs", type=int, default=d.pairs, help="generations with and without the kill")
    p.add_argument("--batch", type=int, default=d.batch, help="sequences generated together")
    p.add_argument("--new-tokens", type=int, default=d.new_tokens)
    p.add_argument("--kill-after", type=int, default=d.kill_after_token, help="SIGKILL s0 after this token")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="per-request timeout, seconds")
    p.add_argument("--charge-teardown", action="store_true",
                   help="time the kernel's teardown of the killed process inside the failover step")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = p.parse_args()
    r = run_paired_failover(PairedFailoverConfig(
        arch=args.arch, n_servers=args.servers, replicas=args.replicas, pairs=args.pairs, batch=args.batch,
        new_tokens=args.new_tokens, kill_after_token=args.kill_after, timeout_s=args.timeout,
        charge_teardown=args.charge_teardown))
    for i, pr in enumerate(r.per_pair):
        print(f"pair {i} (deployment {pr['killed_deployment']} killed, {'it' if pr['kill_steps_first'] else 'control'} "
              f"steps first): window {pr['window_s_control']:.3f}s "
              f"-> {pr['window_s_kill']:.3f}s with the kill (drop_window {100 * pr['drop_window']:+.2f}%); "
              f"drop {100 * pr['drop']:+.2f}% = resent "
              f"{100 * pr['resent_part']:+.2f}% + capacity {100 * pr['capacity_part']:+.2f}%; noise before the "
              f"kill {100 * pr['noise_before']:+.2f}%; stall {1000 * pr['failover_wait_s']:.1f} ms, teardown "
              f"{pr['teardown_ms']:.0f} ms, "
              f"{pr['resent_tokens']} token rows resent", flush=True)
    print(f"pairs {r.pairs}  drop_median {r.drop_median:.4f}  drop_p90 {r.drop_p90:.4f}  "
          f"(min {r.drop_min:.4f}, max {r.drop_max:.4f})  drop_window_median {r.drop_window_median:.4f}  "
          f"drop_window_p90 {r.drop_window_p90:.4f}  resent_part_median {r.resent_part_median:.4f}  "
          f"capacity_part_median {r.capacity_part_median:.4f}  noise_before_median {r.noise_before_median:.4f}  "
          f"tokens_identical {r.tokens_identical}  max_abs_logit_err {r.max_abs_logit_err:.1e}")
    if not r.judged:
        print(f"not judged: the noise floor {100 * r.noise_before_median:+.2f}% (the same estimator over the steps "
              f"before the kill) exceeds +-{100 * r.config['max_noise_floor']:.1f}%: the machine was too busy")
    if args.json:
        args.json.write_text(json.dumps(r.to_json(), indent=2) + "\n")
    return 0 if r.tokens_identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
