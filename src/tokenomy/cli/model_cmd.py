"""``tokenomy model tiny DIR``: build the small random Llama that vLLM CPU serves (no download)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="build local model folders (tiny: a random Llama + tokenizer for vLLM CPU)")
    msub = p.add_subparsers(dest="model_command", required=True)
    t = msub.add_parser("tiny", help="an 18 MB random Llama (hidden 256, 4 layers) with a BPE tokenizer and chat template")
    t.add_argument("dir", type=Path, help="output folder (created; its model files are replaced)")
    t.add_argument("--seed", type=int, default=0, help="weights and tokenizer corpus seed (same seed: same files)")
    t.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size target")
    t.set_defaults(func=run_tiny)


def run_tiny(args: argparse.Namespace) -> int:
    from tokenomy.vllm.tiny import TinyLlama, build_tiny_model

    if args.vocab_size < 300:
        raise ValueError(f"--vocab-size must be at least 300 (256 bytes + special tokens), got {args.vocab_size}")
    t0 = time.perf_counter()
    out = build_tiny_model(args.dir, TinyLlama(vocab_size=args.vocab_size, seed=args.seed))
    size_mb = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6
    print(f"tiny Llama in {out} ({size_mb:.0f} MB, {time.perf_counter() - t0:.1f}s)")
    return 0
