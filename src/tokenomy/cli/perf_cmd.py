"""``tokenomy perf``: fit and validate the performance model, show a model on a GPU."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tokenomy.bench.config import normalize_target
from tokenomy.bench.profile import ProfilePlan, profile
from tokenomy.cli.bench_cmd import discover_model
from tokenomy.cli.common import CLIError
from tokenomy.metrics.report import finite_or_none, write_json
from tokenomy.perf.coefficients import SHIPPED_FILE, save_coefficients
from tokenomy.perf.model import DEFAULT_ACTIVATION_RESERVE_BYTES, PerfModel

if TYPE_CHECKING:
    from tokenomy.perf.calibrate import Calibration

_PLAN = ProfilePlan()


def _calibrate(profiles: str) -> Calibration:
    from tokenomy.perf.calibrate import calibrate  # scipy: imported only when fitting

    root = Path(profiles)
    if not root.is_dir():
        raise FileNotFoundError(f"--profiles {root} is not a directory (expected Vidur's profiles/ with compute/)")
    return calibrate(root)


def _validation_table(cal: Calibration) -> Table:
    table = Table(title="held-out MAPE: uncalibrated roofline vs fitted (per operator call; per layer)")
    for col in ("GPU", "points", "roofline", "fitted", "layer roofline", "layer fitted", "all-reduce fitted"):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    rows = [(v.gpu, v.points, v.mape_roofline, v.mape_fitted, v.layer_mape_roofline, v.layer_mape_fitted,
             v.allreduce_mape_fitted) for v in cal.validation]
    s = cal.summary()
    rows.append(("all", s["points"], s["mape_roofline"], s["mape_fitted"], s["layer_mape_roofline"],
                 s["layer_mape_fitted"], float("nan")))
    for gpu, points, *mapes in rows:
        table.add_row(str(gpu), str(points), *("-" if m != m else f"{m:.1%}" for m in mapes))
    return table


def _fit(args: argparse.Namespace) -> int:
    cal = _calibrate(args.profiles)
    out = Path(args.out)
    save_coefficients(out, cal.coefficients, source=f"tokenomy perf fit on Vidur profiles (training half of {args.profiles})")
    console = Console()
    console.print(_validation_table(cal))
    console.print(f"wrote coefficients for {', '.join(sorted(cal.coefficients))} to {out}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    cal = _calibrate(args.profiles)
    Console().print(_validation_table(cal))
    if args.json:
        payload = {"schema": "tokenomy.perf-validate/1", "settings": {"profiles": str(Path(args.profiles))},
                   **finite_or_none(cal.summary())}
        write_json(args.json, payload)
    return 0


def _weight_dtype(bytes_per_param: float) -> str:
    return {0.5: "4-bit", 1: "8-bit", 2: "16-bit", 4: "32-bit"}.get(bytes_per_param, f"{bytes_per_param:g} B/param")


def _show(args: argparse.Namespace) -> int:
    if args.tp < 1:
        raise CLIError(f"--tp must be >= 1, got {args.tp}")
    pm = PerfModel.from_names(args.model, args.gpu, args.tp)
    m = pm.model
    table = Table(title=f"{m.name} on {pm.tp} x {pm.gpu.name}", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("params total / active", f"{m.total_params / 1e9:.2f} B / {m.active_params / 1e9:.2f} B"),
        ("weights", f"{m.weight_bytes / 1e9:.1f} GB ({_weight_dtype(m.weight_bytes_per_param or m.dtype_bytes)})"),
        ("KV bytes / token (all ranks)", f"{pm.kv_bytes_per_token:,.0f} B"),
    ]
    try:
        rows.append(("KV capacity (90% memory)", f"{pm.kv_capacity_tokens():,} tokens"))
    except ValueError as exc:
        # Step times of a model that cannot load are meaningless: say why, exit 2.
        short = m.weight_bytes - pm.tp * (pm.gpu.memory_bytes * 0.9 - DEFAULT_ACTIVATION_RESERVE_BYTES)
        raise CLIError(f"--model {args.model} does not fit --gpu {args.gpu} x --tp {args.tp}: {exc}; "
                       f"short by {short / 1e9:.1f} GB") from None
    rows += [
        ("prefill 1k tokens", f"{pm.prefill_time_s(1024) * 1e3:.1f} ms"),
        ("prefill 8k tokens", f"{pm.prefill_time_s(8192) * 1e3:.1f} ms"),
        ("decode step, batch 1 @ 1k ctx", f"{pm.decode_step_time_s(1, 1024) * 1e3:.2f} ms"),
        ("decode step, batch 64 @ 1k ctx", f"{pm.decode_step_time_s(64, 1024) * 1e3:.2f} ms"),
        ("KV transfer 8k tokens (inter-node)", f"{pm.kv_transfer_time_s(8192) * 1e3:.1f} ms"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    return 0


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _profile(args: argparse.Namespace) -> int:
    api_key = args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY")
    try:
        plan = ProfilePlan(prompt_tokens=args.prompt_tokens, batches=args.batches, contexts=args.contexts,
                           decode_tokens=args.decode_tokens, repeats=args.repeats, cached_tails=args.cached_tails,
                           mixed_tails=args.mixed_tails, mixed_batches=args.mixed_batches,
                           max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
        target = normalize_target(args.target)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    model = args.model or discover_model(target, api_key)
    console = Console()
    console.print(f"profiling {model} at {target}")
    try:
        cal = profile(target, plan, model=model, api_key=api_key, seed=args.seed,
                      on_progress=None if args.quiet else console.print)
    except RuntimeError as exc:
        raise CLIError(str(exc)) from None
    cal.save(args.out)
    table = Table(title=f"fitted step time of {model} (seconds per unit)")
    table.add_column("coefficient")
    table.add_column("value", justify="right")
    for name, value in cal.step.to_dict().items():
        table.add_row(name, f"{value:.4g}")
    console.print(table)
    by_kind = ", ".join(f"{k} {v:.1%}" for k, v in cal.fit["mape_by_kind"].items())
    engine = ", ".join(f"{k} {v}" for k, v in cal.engine.__dict__.items() if v is not None) or "none reported"
    spread = cal.fit.get("repeat_spread")
    noise = "" if spread is None else f"; repeats of one probe lay {spread:.0%} apart (median), the machine's noise"
    console.print(f"fit: {cal.fit['points']} measurements, mean |error| {cal.fit['mape']:.1%} ({by_kind}){noise}")
    console.print(f"engine limits: {engine}")
    timing = cal.fit.get("decode_timing")
    if timing:
        console.print(f"decode probes timed by the engine's inter-token histogram: {timing['engine']}, "
                      f"by the client: {timing['client']}")
    for note in cal.fit.get("skipped", []):
        console.print(f"skipped: {note}")
    console.print(f"wrote {args.out}; simulate with: tokenomy sim --calibration {args.out} --model <config.json> ...")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    perf = sub.add_parser("perf", help="performance model: fit, validate, show, profile a live engine")
    perf_sub = perf.add_subparsers(dest="perf_command", required=True)

    fit = perf_sub.add_parser("fit", help="fit efficiency coefficients to Vidur profiles")
    fit.add_argument("--profiles", required=True, help="Vidur profiles/ folder (compute/, network/)")
    fit.add_argument("--out", default=SHIPPED_FILE, help="output JSON (default: %(default)s)")
    fit.set_defaults(func=_fit)

    validate = perf_sub.add_parser("validate", help="held-out error of roofline vs fitted model")
    validate.add_argument("--profiles", required=True, help="Vidur profiles/ folder (compute/, network/)")
    validate.add_argument("--json", help="write {mape_roofline, mape_fitted, points, per_gpu} here")
    validate.set_defaults(func=_validate)

    show = perf_sub.add_parser("show", help="sizes and step times of a model on a GPU")
    show.add_argument("--model", required=True, help="catalog name or path to a Hugging Face config.json")
    show.add_argument("--gpu", required=True, help="catalog name or path to a GPU YAML/JSON")
    show.add_argument("--tp", type=int, default=1, help="GPUs per instance (default: %(default)s)")
    show.set_defaults(func=_show)

    prof = perf_sub.add_parser(
        "profile", help="measure a running engine's prefill and decode step times and fit the simulator's step model",
        description="Sends single requests at several prompt lengths (prefill) and batches of streams at several "
                    "contexts (decode) to an OpenAI-compatible engine and fits the step-time model `tokenomy sim "
                    "--calibration` reads (docs/simulator.md).")
    prof.add_argument("--target", required=True, help="engine base URL (http://host:port or .../v1)")
    prof.add_argument("--out", default="calibration.json", help="calibration file to write (default: %(default)s)")
    prof.add_argument("--model", default=None, help="model name to send (default: the target's first /v1/models entry)")
    prof.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY if set)")
    prof.add_argument("--prompt-tokens", type=_ints, default=_PLAN.prompt_tokens,
                      help="prefill probe lengths (default: %(default)s)")
    prof.add_argument("--batches", type=_ints, default=_PLAN.batches,
                      help="decode probe batch sizes (default: %(default)s)")
    prof.add_argument("--contexts", type=_ints, default=_PLAN.contexts,
                      help="decode probe context lengths in tokens (default: %(default)s)")
    prof.add_argument("--cached-tails", type=_ints, default=_PLAN.cached_tails,
                      help="prompt lengths sent alone after each context while it is cached, as an agent's turns "
                           "are (default: none)")
    prof.add_argument("--mixed-tails", type=_ints, default=_PLAN.mixed_tails,
                      help="chunk lengths sent after each cached context while --mixed-batches streams decode on it "
                           "(a mixed step, which pins the step's fixed cost; default: none)")
    prof.add_argument("--mixed-batches", type=_ints, default=_PLAN.mixed_batches,
                      help="decoding streams under each mixed probe (default: %(default)s)")
    prof.add_argument("--decode-tokens", type=int, default=_PLAN.decode_tokens,
                      help="tokens each decode stream generates (default: %(default)s)")
    prof.add_argument("--repeats", type=int, default=_PLAN.repeats,
                      help="rounds of the whole plan, each probe once a round; its median is kept (default: %(default)s)")
    prof.add_argument("--max-num-batched-tokens", type=int, default=None,
                      help="the engine's per-step token budget, which chunks long prompts (default: what the target "
                           "reports; vLLM does not, so give it: 2048 on vLLM CPU, 8192 on GPU by default)")
    prof.add_argument("--max-num-seqs", type=int, default=None, help="the engine's batch limit, recorded for the simulator")
    prof.add_argument("--seed", type=int, default=None,
                      help="prompt-text seed (default: fresh each run, so a rerun misses the prefix cache)")
    prof.add_argument("--quiet", action="store_true", help="no per-probe lines")
    prof.set_defaults(func=_profile)
