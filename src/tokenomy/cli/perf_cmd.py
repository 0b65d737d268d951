"""``tokenomy perf``: fit and validate the performance model, show a model on a GPU."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tokenomy.cli.main import CLIError
from tokenomy.metrics.report import finite_or_none, write_json
from tokenomy.perf.coefficients import SHIPPED_FILE, save_coefficients
from tokenomy.perf.model import DEFAULT_ACTIVATION_RESERVE_BYTES, PerfModel

if TYPE_CHECKING:
    from tokenomy.perf.calibrate import Calibration


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
    show.add_argument("--model", required=True, help="catalog name or path to a Hugging Face config.json")
    show.add_argument("--gpu", required=True, help="catalog name or path to a GPU YAML/JSON")
    show.add_argument("--tp", type=int, default=1, help="GPUs per instance (default: %(default)s)")
    show.set_defaults(func=_show)
