"""``tokenomy perf``: fit and validate the performance model, show a model on a GPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tokenomy.perf.calibrate import Calibration, calibrate
from tokenomy.perf.coefficients import SHIPPED_FILE, save_coefficients
from tokenomy.perf.model import PerfModel


def _calibrate(profiles: str) -> Calibration:
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
        Path(args.json).write_text(json.dumps(cal.summary(), indent=2) + "\n")
    return 0


def _show(args: argparse.Namespace) -> int:
    pm = PerfModel.from_names(args.model, args.gpu, args.tp)
    m = pm.model
    table = Table(title=f"{m.name} on {pm.tp} x {pm.gpu.name}", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("params total / active", f"{m.total_params / 1e9:.2f} B / {m.active_params / 1e9:.2f} B"),
        ("weights", f"{m.weight_bytes / 1e9:.1f} GB"),
        ("KV bytes / token (all ranks)", f"{pm.kv_bytes_per_token:,.0f} B"),
    ]
    try:
        rows.append(("KV capacity (90% memory)", f"{pm.kv_capacity_tokens():,} tokens"))
    except ValueError as exc:
        rows.append(("KV capacity (90% memory)", f"does not fit: {exc}"))
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


def register(sub: argparse._SubParsersAction) -> None:
    perf = sub.add_parser("perf", help="performance model: fit, validate, show")
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
    show.add_argument("--model", required=True)
    show.add_argument("--gpu", required=True)
    show.add_argument("--tp", type=int, default=1)
    show.set_defaults(func=_show)
