"""Micro-benchmark: the cost of one ``PerfModel.step_time_s`` call (the simulator calls it every step).

Prints microseconds per call for a DeepSeek-V3 / H200 x16 mixed step (512 prefill tokens beside 60
decodes), best of ``--repeat`` rounds, and writes ``{"us_per_call": ...}`` with ``--json OUT``.
Replaces a timed assertion that used to sit in the test suite. ~1.5 us on a quiet core.
"""

from __future__ import annotations

import argparse
import json
import timeit

from tokenomy.core import StepShape
from tokenomy.perf import PerfModel, get_gpu, get_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is reported (default 3)")
    parser.add_argument("--json", default=None, help="write the result as JSON to this path")
    args = parser.parse_args()
    pm = PerfModel(get_model("DeepSeek-V3"), get_gpu("h200"), tp=16)
    shape = StepShape(prefill_tokens=512, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(512, 1000),
                      prefill_context_tokens=1512, decode_seqs=60, decode_context_tokens=120_000)
    best = min(timeit.repeat(lambda: pm.step_time_s(shape), number=args.calls, repeat=args.repeat))
    us = best / args.calls * 1e6
    print(f"PerfModel.step_time_s: {us:.2f} us per call (best of {args.repeat} x {args.calls})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"us_per_call": us, "calls": args.calls, "repeat": args.repeat}, f)


if __name__ == "__main__":
    main()
