"""Micro-benchmark: how fast one saturated Engine steps, with a trivial step-time model.

Feeds a Mooncake-like load (prompts ~7k tokens sharing a system prompt, ~350 output tokens)
into one engine, keeps the queue full, steps it on a virtual clock and prints output tokens per
wall second (the number that bounds the simulator's speed), decode steps per second, and the
prefix-cache hit rate. Usage: ``python benchmarks/engine_step_speed.py [--requests N]``.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from tokenomy.core import Request, StepShape
from tokenomy.engine import Engine, EngineConfig


class TrivialPerf:
    """10 ms per step plus 20 us per prefill token: enough to order events, nothing to compute."""

    def step_time_s(self, shape: StepShape) -> float:
        return 0.01 + 2e-5 * shape.prefill_tokens

    def step_flops(self, shape: StepShape) -> float:
        return 0.0


def make_requests(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = max(64, int(rng.lognormvariate(8.85, 0.5)))  # p50 ~7k tokens
        shared = min(prompt - 1, 1024 * rng.randint(0, 4))  # a few system prompts of 0-4k tokens
        content = ((1, shared), (1000 + i, prompt - shared)) if shared else ((1000 + i, prompt),)
        output = max(1, int(rng.lognormvariate(5.86, 0.4)))  # p50 ~350 tokens
        out.append(Request(f"r{i}", 0.0, prompt, output, content=content))
    return out


def trace_requests(path: str, n: int) -> list[Request]:
    """First ``n`` Mooncake requests; hash id ``h`` (512 tokens) becomes content stream ``h``."""
    out = []
    with open(path) as f:
        for i, line in zip(range(n), f, strict=False):
            row = json.loads(line)
            prompt, ids = row["input_length"], row["hash_ids"]
            content = tuple((h, min(512, prompt - 512 * j)) for j, h in enumerate(ids))
            out.append(Request(f"m{i}", 0.0, prompt, max(1, row["output_length"]), content=content))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=30_000, help="KV blocks")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--queue", type=int, default=64, help="waiting requests kept queued")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", help="Mooncake JSONL trace to take prompts from (e.g. ../shared/data/...)")
    args = parser.parse_args()

    engine = Engine(
        "bench", EngineConfig(num_gpu_blocks=args.blocks, block_size_tokens=args.block_size), TrivialPerf()
    )
    pending = (
        trace_requests(args.trace, args.requests) if args.trace else make_requests(args.requests, args.seed)
    )
    kv_tokens = args.blocks * args.block_size
    pending = [r for r in pending if r.prompt_tokens + r.max_output_tokens < kv_tokens]
    pending.reverse()
    now, steps, output_tokens, decode_tokens = 0.0, 0, 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    while pending or engine.has_unfinished():
        while pending and engine.num_waiting < args.queue:
            engine.add_request(pending.pop(), now)
        result = engine.step(now)
        if result is None:
            break
        steps += 1
        output_tokens += len(result.emitted)
        decode_tokens += result.shape.decode_seqs
        now = result.end_s
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0  # robust to other processes sharing the core
    stats = engine.stats
    print(f"requests={args.requests} steps={steps} simulated={now:.1f}s wall={wall:.2f}s cpu={cpu:.2f}s")
    print(f"output tokens/s: {output_tokens / wall:,.0f} wall, {output_tokens / cpu:,.0f} cpu")
    print(f"decode tokens/s: {decode_tokens / wall:,.0f} wall, {decode_tokens / cpu:,.0f} cpu")
    print(f"steps/s (cpu): {steps / cpu:,.0f}   mean batch: {decode_tokens / max(steps, 1):.1f} decodes")
    print(f"prefix-cache hit rate: {stats.prefix_cache_hit_rate:.3f}  preemptions: {stats.num_preemptions}")


if __name__ == "__main__":
    main()
