"""Emulator capacity: does one ``tokenomy emulate`` keep the modelled pace under many streams?

Starts one emulator (Llama-3.1-8B on H100 by default) and drives it with ``tokenomy bench`` at a
fixed number of concurrent streams (closed loop: each stream is a one-turn session of a short
prompt and a long answer, the next session starting as soon as one ends), for each of
``--streams``. For each it reports the inter-token latency the perf model gives for a decode
step of that batch (mean context: prompt + half the answer) next to the ITL P50 the bench
observed (pooled gaps between streamed chunks), and the output tokens per second delivered. Two
more columns tell a slow emulator from a slow bench: the observed TPOT P50 (a per-request average,
immune to chunks arriving in bursts) and the mean ITL of the emulator's own
``vllm:inter_token_latency_seconds`` histogram (the gaps as the server delivered them).
Target from issue 8: at 64 streams the observed ITL P50 is within 10% of the model's.

    python benchmarks/emulator_capacity.py --json out/emulator_capacity.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import httpx
from _emulated import emulator

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import Session, Turn
from tokenomy.metrics.report import write_json
from tokenomy.perf import PerfModel


def _itl_sum_count(url: str) -> tuple[float, float]:
    """The emulator's own ``vllm:inter_token_latency_seconds`` histogram: (sum, count)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    got = {}
    for name in ("sum", "count"):
        m = re.search(rf"^vllm:inter_token_latency_seconds_{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        got[name] = float(m.group(1)) if m else 0.0
    return got["sum"], got["count"]


def measure(url: str, model: str, streams: int, args: argparse.Namespace) -> dict[str, float | None]:
    turn = Turn(prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens)
    sessions = [Session(f"cap{streams}-{i}", 0.0, (turn,)) for i in range(streams * 8)]
    config = BenchConfig(targets=(url,), model=model, api="completions", concurrency=streams,
                         duration_s=args.duration)
    s0, c0 = _itl_sum_count(url)
    rep = run_bench(sessions, config)
    s1, c1 = _itl_sum_count(url)
    return {"itl_p50_observed_s": rep.summary.itl_p50_s, "tokens_per_s": rep.summary.output_tps,
            # Robust to chunks arriving in bursts (a per-request average), and the server's own view.
            "tpot_p50_observed_s": rep.summary.tpot_p50_s,
            "itl_mean_server_s": (s1 - s0) / (c1 - c0) if c1 > c0 else None,
            "errors": sum(rep.errors_by_status.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="64,256", help="comma-separated concurrent stream counts")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of sending per stream count")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=1024)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    counts = [int(x) for x in args.streams.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        print("emulator_capacity: --streams needs positive integers", file=sys.stderr)
        return 2
    perf = PerfModel.from_names(args.model, args.gpu, 1)
    out: dict[str, list[float | None]] = {"streams": [], "itl_p50_model_s": [], "itl_p50_observed_s": [],
                                          "tokens_per_s": [], "tpot_p50_observed_s": [], "itl_mean_server_s": [],
                                          "errors": []}
    emu_args = ["--model", args.model, "--gpu", args.gpu, "--max-num-seqs", str(max(max(counts), 256))]
    with emulator(emu_args) as url:
        for n in counts:
            got = measure(url, args.model, n, args)
            model_itl = perf.decode_step_time_s(n, args.prompt_tokens + args.output_tokens / 2)
            for key, value in (("streams", n), ("itl_p50_model_s", model_itl), *got.items()):
                out[key].append(value)
            obs = got["itl_p50_observed_s"]
            ratio = f"{obs / model_itl:.2f}x" if obs else "-"
            print(f"{n:4d} streams: model ITL {model_itl * 1e3:.2f} ms, observed P50 "
                  f"{(obs or 0) * 1e3:.2f} ms ({ratio}), TPOT P50 {(got['tpot_p50_observed_s'] or 0) * 1e3:.2f} ms, "
                  f"server ITL mean {(got['itl_mean_server_s'] or 0) * 1e3:.2f} ms, {got['tokens_per_s'] or 0:,.0f} tok/s, "
                  f"{got['errors']} errors", flush=True)
    if args.json:
        write_json(args.json, out)
        print(f"wrote {args.json}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
