"""EAAS dual-batch overlap benchmark: exposed communication time, serial vs two ping-ponged halves.

A round trip of ``--rtt-ms`` is injected in the transport. Exposed communication = wall time minus the
client's own compute time. The two modes run as back-to-back pairs (order alternating); per pair
``hidden = 1 - exposed_overlap / exposed_serial``, and ``hidden_fraction`` is the median over pairs,
printed with its spread. It is bounded by (half-batch local compute) / (round trip), so
``--mixer-width`` sets how much there is to hide behind.

    python benchmarks/eaas_overlap.py --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenomy.eaas.overlap import OverlapConfig, run_overlap


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtt-ms", type=float, default=5.0, help="injected round trip per expert request")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=256)
    p.add_argument("--mixer-width", type=int, default=4096, help="width of the local (attention stand-in) layer")
    p.add_argument("--iterations", type=int, default=15, help="pairs (one serial and one overlapped forward)")
    p.add_argument("--servers", type=int, default=1, help="expert servers (each hosts all experts / n)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = p.parse_args()
    r = run_overlap(OverlapConfig(rtt_delay_s=args.rtt_ms / 1000, n_servers=args.servers, n_layers=args.layers,
                                  batch_tokens=args.batch_tokens, mixer_width=args.mixer_width,
                                  iterations=args.iterations))
    print("medians per forward of the whole stack:")
    print(f"serial : wall {r.wall_s_serial:.3f}s compute {r.compute_s_serial:.3f}s "
          f"(client cpu {r.client_cpu_s_serial:.3f}s) exposed_comm_s_serial {r.exposed_comm_s_serial:.3f}")
    print(f"overlap: wall {r.wall_s_overlap:.3f}s compute {r.compute_s_overlap:.3f}s "
          f"(client cpu {r.client_cpu_s_overlap:.3f}s) exposed_comm_s_overlap {r.exposed_comm_s_overlap:.3f}")
    print(f"hidden_fraction {r.hidden_fraction:.3f} (median of {r.pairs} pairs; p10 {r.hidden_fraction_p10:.3f}, "
          f"p90 {r.hidden_fraction_p90:.3f}, min {r.hidden_fraction_min:.3f}, max {r.hidden_fraction_max:.3f})  "
          f"(max |err| vs monolithic stack {r.max_abs_err:.1e})")
    if args.json:
        args.json.write_text(json.dumps(r.to_json(), indent=2) + "\n")
    return 0 if r.max_abs_err <= 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
