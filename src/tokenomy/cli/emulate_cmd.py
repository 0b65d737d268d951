"""``tokenomy emulate``: one emulated vLLM-compatible engine instance on an HTTP port."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tokenomy.cli.common import CLIError
from tokenomy.core import Role
from tokenomy.emulator.config import (
    DEFAULT_DECODE_MAX_NUM_SEQS,
    DEFAULT_EOS_MEAN_TOKENS,
    DEFAULT_KV_RELEASE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_LAG_S,
    DEFAULT_MAX_NUM_SEQS,
    EmulatorConfig,
    default_max_num_seqs,
)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model, hardware and engine flags, named as in ``tokenomy sim``."""
    g = p.add_argument_group("engine (as in tokenomy sim)")
    g.add_argument("--model", default="llama-3.1-8b")
    g.add_argument("--gpu", default="h100")
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--role", default="mixed", choices=[r.value for r in Role], help="mixed | prefill | decode")
    g.add_argument("--max-num-batched-tokens", type=int, default=8192)
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help=f"most running requests (default {DEFAULT_MAX_NUM_SEQS}; decode role "
                        f"{DEFAULT_DECODE_MAX_NUM_SEQS}, as tokenomy sim)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--num-gpu-blocks", type=int, default=None, help="override the KV blocks the model gives")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    g.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's own, as vLLM; capped by KV)")
    g.add_argument("--link-gbps", type=float, default=None,
                   help="PD: KV-transfer bandwidth into this instance, GB/s (default: the GPU's NIC)")
    g.add_argument("--kv-transfer-timeout", type=float, default=None, metavar="S",
                   help="PD: cut a KV pull still in flight after S modelled seconds and fail its request "
                        "(504); concurrent pulls share the port's bandwidth (default: no timeout)")


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--served-model-name", default=None, help="name clients send as 'model' (default: --model)")
    g.add_argument("--tokenizer", type=Path, default=None, help="a Hugging Face tokenizer.json (default: built-in)")
    g.add_argument("--eos-mean-tokens", type=float, default=DEFAULT_EOS_MEAN_TOKENS,
                   help="mean answer length when a request neither sets ignore_eos nor hits max_tokens; 0: always max_tokens")
    g.add_argument("--kv-release-timeout", type=float, default=DEFAULT_KV_RELEASE_TIMEOUT_S,
                   help="PD prefill side: seconds to keep KV for a decode instance to pull")
    g.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per modelled second (0.1: 10x faster)")
    g.add_argument("--max-lag-ms", type=float, default=DEFAULT_MAX_LAG_S * 1e3,
                   help="how far the wall clock may fall behind the model before it re-anchors")
    g.add_argument("--trace-events", type=Path, default=None, metavar="FILE",
                   help="write the engine's events (admissions, preemptions, evictions, steps) as JSON lines")
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    g.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies get 413 (default 16 MiB)")
    g.add_argument("--kv-peer", action="append", default=None, metavar="HOST",
                   help="a host (besides loopback) whose prefill instance this one may notify after a KV "
                        "pull (kv_transfer_params.remote_host); repeat for more")


def config_from_args(args: argparse.Namespace, *, port: int, instance_id: str) -> EmulatorConfig:
    return EmulatorConfig(
        model=args.model, gpu=args.gpu, tp=args.tp, role=Role(args.role),
        served_model_name=args.served_model_name, instance_id=instance_id,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=default_max_num_seqs(Role(args.role)) if args.max_num_seqs is None else args.max_num_seqs,
        block_size_tokens=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks=args.num_gpu_blocks, enable_prefix_caching=not args.no_prefix_caching,
        max_model_len=args.max_model_len, tokenizer=args.tokenizer, trace_events=args.trace_events,
        eos_mean_tokens=args.eos_mean_tokens,
        kv_release_timeout_s=args.kv_release_timeout,
        link_bytes_per_s=None if args.link_gbps is None else args.link_gbps * 1e9,
        kv_transfer_timeout_s=args.kv_transfer_timeout,
        time_scale=args.time_scale, max_lag_s=args.max_lag_ms / 1e3, host=args.host, port=port,
        max_body_bytes=args.max_body_bytes, kv_peers=tuple(args.kv_peer or ()),
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emulate", help="serve one emulated engine instance (OpenAI-compatible HTTP)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--instance-id", default=None, help="engine id in PD hand-offs (default: emulator-PORT)")
    add_engine_args(p)
    add_server_args(p)
    p.set_defaults(func=run_emulate)


def validate(config: EmulatorConfig) -> None:
    """Fail fast, with the flag's name, on what only building the model would reveal."""
    try:
        perf = config.perf_model()
        engine = config.engine_config(perf)
    except KeyError as exc:
        raise CLIError(f"--model/--gpu: {exc.args[0] if exc.args else exc}") from None
    if config.tokenizer is not None:
        from tokenomy.emulator.tokenizer import load_tokenizer

        load_tokenizer(config.tokenizer)
    if config.trace_events is not None:
        try:
            with open(config.trace_events, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise CLIError(f"--trace-events {config.trace_events}: cannot write: {exc.strerror or exc}") from None
    del engine


def serve(config: EmulatorConfig, log_level: str = "warning") -> None:
    """Run the server until SIGINT/SIGTERM (uvicorn handles both)."""
    import uvicorn

    from tokenomy.emulator.server import build_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    uvicorn.run(build_app(config), host=config.host, port=config.port, log_level=log_level,
                access_log=False, loop="auto", http="auto", lifespan="on", timeout_graceful_shutdown=2)


def run_emulate(args: argparse.Namespace) -> int:
    config = config_from_args(args, port=args.port, instance_id=args.instance_id or f"emulator-{args.port}")
    validate(config)
    print(f"tokenomy emulate: {config.model_name} ({config.role}) on {config.gpu} x{config.tp} at "
          f"http://{config.host}:{config.port}", file=sys.stderr, flush=True)
    serve(config, args.log_level)
    return 0
