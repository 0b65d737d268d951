"""EAAS load-balance benchmark: Zipf expert popularity, naive placement vs hot-expert replication.

Both placements hold the same number of expert copies per server. Prints max/mean token load across
servers before (uniform replicas) and after (replication + rebalancing from measured expert load).

    python benchmarks/eaas_balance.py --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenomy.eaas.skew import SkewConfig, run_skew


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--servers", type=int, default=8)
    p.add_argument("--slots", type=int, default=4, help="expert copies per server")
    p.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of expert popularity")
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = p.parse_args()
    r = run_skew(SkewConfig(n_experts=args.experts, top_k=args.top_k, n_servers=args.servers,
                            slots_per_server=args.slots, zipf_exponent=args.zipf, batches=args.batches,
                            seed=args.seed))
    print(f"max_over_mean_before {r.max_over_mean_before:.3f}  loads {r.loads_before}")
    print(f"max_over_mean_after  {r.max_over_mean_after:.3f}  loads {r.loads_after}")
    print(f"placement after: {r.placement_after}")
    if args.json:
        args.json.write_text(json.dumps(r.to_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
