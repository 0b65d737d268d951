"""Can any AMPD meet colocated-offload's P99 TTFT at a point of the grid? Bounds.

The grid's all-turns rule (``benchmarks/ampd_grid.py``, ``p99_ttft_no_worse``): at every rate where
AMPD attains >= 90%, its P99 TTFT is no worse than the best other deployment's (colocated-offload
at every rate of (a) and (c)). This script runs, at one point, for several rates and workload
seeds:

* ``colocated-offload`` (the reference) and AMPD as the grid runs it (``--ampd``);
* **memory bound** (``--kv-factors``): ``ampd@1:3`` (``--memory-shape``) whose decode GPUs hold F x their own KV
  memory (an H100 with more HBM and the same speed: not a real GPU; F = 4/3 is the KV of
  colocated-offload's four instances spread over AMPD's three decode instances);
* **TPOT bound** (``--itl-factors``): ``ampd@0:4`` (``--tpot-shape``; no prefill instance: all the memory
  decodes) whose local prefill steps may last K x the TPOT SLO, so local prefills spend the
  decode streams' TPOT the way colocated-offload's full chunks do.

If no bound meets the reference's tail, AMPD cannot, whatever its policies. Every cell prints
attainment / P99 TTFT (s) / P99 TPOT (ms); ``ok`` marks a cell whose P99 TTFT <= the reference's
(same rate and seed), ``-`` a cell under 90% attainment (the rule does not look at it).

    python benchmarks/ampd_tail_bounds.py --json out/tail_bounds.json                 # (c): 72 simulations, ~11 min CPU
    python benchmarks/ampd_tail_bounds.py --point a --rates 2.0,2.5 --ampd ampd@0:8,ampd-itl-bound@0:8,ampd@1:7 \\
        --kv-factors 1.333 --memory-shape ampd@1:7 --tpot-shape ampd@0:8 --json out/tail_bounds_a.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenomy.experiment.jobs import load_sessions
from tokenomy.experiment.spec import DeploymentSpec, ExperimentSpec
from tokenomy.perf import PerfModel
from tokenomy.perf.hardware import get_gpu
from tokenomy.sim import SimConfig, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ampd_grid import POINTS  # noqa: E402  (the grid's points: same workloads, SLOs and clusters)

REFERENCE = "colocated-offload"
Cell = tuple[str, str, float, int]  # (label, deployment, rate, seed)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _fmt(x: float | None, scale: float, spec: str) -> str:
    """A figure of a table cell; "n/a" when the run finished no request (no percentile)."""
    return format(x * scale, spec) if x is not None else format("n/a", f">{spec.split('.')[0]}")


def bigger_kv_gpu(cfg: SimConfig, factor: float, folder: Path) -> str:
    """A GPU file: ``cfg``'s GPU with HBM raised so an instance of it holds ``factor`` x its KV tokens."""
    gpu = get_gpu(cfg.gpu)
    perf = PerfModel.from_names(cfg.model, cfg.gpu, cfg.tp)
    u = cfg.gpu_memory_utilization
    kv_per_gpu = perf.kv_capacity_tokens(u) * perf.model.kv_bytes_per_token / cfg.tp
    memory = gpu.memory_bytes + (factor - 1.0) * kv_per_gpu / u
    path = folder / f"kv_x{factor:g}.json"
    path.write_text(json.dumps({"name": gpu.name, "memory_bytes": memory}))  # same name: same fitted speed
    return str(path)


def configs(spec: ExperimentSpec, ampd: list[str], kv_factors: list[float], itl_factors: list[float],
            folder: Path, memory_shape: str = "ampd@1:3", tpot_shape: str = "ampd@0:4") -> dict[str, SimConfig]:
    """Label -> simulator config of every deployment and bound to run."""
    out: dict[str, SimConfig] = {}
    for name in [REFERENCE, *ampd]:
        d = DeploymentSpec.parse(name)
        out[name] = spec.sim_config(d, d.split)
    for f in kv_factors:
        d = DeploymentSpec.parse(memory_shape)
        cfg = spec.sim_config(d, d.split)
        out[f"memory bound: {memory_shape}, decode KV x{f:g}"] = replace(
            cfg, decode_gpu=bigger_kv_gpu(cfg, f, folder), decode_tp=cfg.tp)
    for k in itl_factors:
        d = DeploymentSpec.parse(tpot_shape)
        cfg = spec.sim_config(d, d.split)
        placement = replace(cfg.ampd.placement_config, itl_bound_factor=k)
        out[f"TPOT bound: {tpot_shape}, ITL bound x{k:g}"] = replace(
            cfg, ampd=replace(cfg.ampd, placement_config=placement))
    return out


def _run(args: tuple[ExperimentSpec, str, SimConfig, float, int]) -> tuple[str, float, int, dict[str, Any]]:
    spec, label, cfg, rate, seed = args
    if seed:
        spec = replace(spec, workload=replace(spec.workload, seed=spec.workload.seed + seed))
    cpu0 = time.process_time()
    s = simulate(load_sessions(spec, rate)[0], cfg, spec.slo).summary
    return label, rate, seed, {"attainment": s.slo_attainment, "ttft_p99_s": s.ttft_p99_s,
                               "tpot_p99_s": s.tpot_p99_s, "cpu_s": round(time.process_time() - cpu0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--point", default="c", help="a point of benchmarks/ampd_grid.py (default: c)")
    ap.add_argument("--rates", default="0.04,0.06,0.08", help="sessions/s, comma-separated")
    ap.add_argument("--seeds", default="0,1,2", help="workload seed offsets (0: the grid's sample)")
    ap.add_argument("--ampd", default="ampd@2:2,ampd@1:3,ampd-itl-bound@1:3", help="AMPD deployments to run as they are")
    ap.add_argument("--kv-factors", default="1.333,2", help="memory bound: decode KV multipliers ('' for none)")
    ap.add_argument("--itl-factors", default="4,8", help="TPOT bound: ITL bound multipliers ('' for none)")
    ap.add_argument("--memory-shape", default="ampd@1:3", help="the AMPD shape of the memory bound")
    ap.add_argument("--tpot-shape", default="ampd@0:4", help="the AMPD shape of the TPOT bound")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    if args.point not in POINTS:
        print(f"ampd_tail_bounds: error: unknown point {args.point!r}; known: {', '.join(POINTS)}", file=sys.stderr)
        return 2
    try:
        rates, seeds = _floats(args.rates), [int(s) for s in args.seeds.split(",") if s.strip()]
        kv, itl = _floats(args.kv_factors), _floats(args.itl_factors)
    except ValueError as exc:
        print(f"ampd_tail_bounds: error: {exc}", file=sys.stderr)
        return 2
    if not rates or not seeds or any(f <= 0 for f in kv + itl):
        print("ampd_tail_bounds: error: need >= 1 rate and seed, and factors > 0", file=sys.stderr)
        return 2
    spec = POINTS[args.point].specs()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfgs = configs(spec, [a for a in args.ampd.split(",") if a.strip()], kv, itl, Path(tmp),
                           args.memory_shape, args.tpot_shape)
        except ValueError as exc:
            print(f"ampd_tail_bounds: error: {exc}", file=sys.stderr)
            return 2
        jobs = [(spec, label, cfg, r, s) for label, cfg in cfgs.items() for r in rates for s in seeds]
        with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
            done = list(pool.map(_run, jobs))
    cells: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in cfgs}
    for label, rate, seed, cell in done:
        cells[label][f"{rate:g}/s seed {seed}"] = cell
    ref = cells[REFERENCE]
    for label, row in cells.items():
        for key, cell in row.items():
            mine, theirs = cell["ttft_p99_s"], ref[key]["ttft_p99_s"]
            cell["p99_ttft_no_worse"] = (None if label == REFERENCE or cell["attainment"] < 0.9
                                         or mine is None or theirs is None else mine <= theirs)
    keys = [f"{r:g}/s seed {s}" for r in rates for s in seeds]
    print(f"point {args.point}: attainment / P99 TTFT (s) / P99 TPOT (ms); ok: P99 TTFT <= {REFERENCE}'s")
    print(f"{'':52s}" + "".join(f"{k:>26s}" for k in keys))
    for label, row in cells.items():
        marks = {None: " -", True: " ok", False: ""}
        print(f"{label:52s}" + "".join(
            f"{row[k]['attainment']:>9.1%} /{_fmt(row[k]['ttft_p99_s'], 1, '6.2f')} /{_fmt(row[k]['tpot_p99_s'], 1e3, '4.0f')}"
            f"{marks[row[k]['p99_ttft_no_worse']] if label != REFERENCE else '':3s}" for k in keys))
    wall = time.perf_counter() - t0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"point": args.point, "rates": rates, "seeds": seeds, "reference": REFERENCE,
                                     "cells": cells, "wall_s": round(wall, 1),
                                     "cpu_s": round(sum(c["cpu_s"] for r in cells.values() for c in r.values()), 1)},
                                    indent=1))
    print(f"{len(jobs)} simulations, {wall:.0f} s wall; wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
