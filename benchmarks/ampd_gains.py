"""AMPD's gain over the best baseline, from a `tokenomy sim compare` JSON.

Reads the sweep, takes at each rate the best baseline's attainment (the maximum over every
deployment not named ``ampd*``), keeps the rates where that lies in [30%, 70%] (the issue's
"rates where the best baseline attains 30-70% of requests"), and prints AMPD's attainment over
the best baseline's there, on average, plus the goodput ratio (DistServe: max rate at 90%) and,
at every rate where AMPD attains >= 90%, its P99 TTFT beside the best baseline's. When the sweep
has host-tier baselines (``*-offload``), it prints the comparison twice: against every baseline,
and against the whitepaper's baselines alone (colocated and disaggregated without a host tier).

    python benchmarks/ampd_gains.py out/results/gaia.json [more sweeps ...] --json out/results/gaia_gains.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tokenomy.experiment import SweepResult


def gains(
    payload: dict[str, Any], ampd: str = "ampd", low: float = 0.3, high: float = 0.7, host_tier: bool = True
) -> dict[str, Any]:
    """AMPD against the best baseline; ``host_tier`` False leaves out the ``*-offload`` baselines
    (the whitepaper's comparison: colocated and disaggregated serving without a host KV tier)."""
    rates: list[float] = payload["rates"]
    deps: dict[str, Any] = payload["deployments"]
    if ampd not in deps:
        raise KeyError(f"no {ampd!r} in the sweep; deployments: {', '.join(deps)}")
    baselines = {n: d for n, d in deps.items() if not n.startswith("ampd") and (host_tier or "-offload" not in n)}
    if not baselines:
        raise KeyError("the sweep has no baseline deployment")
    rows = []
    for i, rate in enumerate(rates):
        best_name = max(baselines, key=lambda n: baselines[n]["slo_attainment"][i])
        best = baselines[best_name]["slo_attainment"][i]
        mine = deps[ampd]["slo_attainment"][i]
        rows.append({"rate": rate, "best_baseline": best_name, "baseline_attainment": best,
                     "ampd_attainment": mine, "ratio": mine / best if best > 0 else None,
                     "ampd_ttft_p99_s": deps[ampd]["ttft_p99_s"][i],
                     "baseline_ttft_p99_s": baselines[best_name]["ttft_p99_s"][i]})
    band = [r for r in rows if low <= r["baseline_attainment"] <= high and r["ratio"] is not None]
    best_goodput_name = max(baselines, key=lambda n: baselines[n]["goodput_rps"])
    best_goodput = baselines[best_goodput_name]["goodput_rps"]
    return {
        "workload": payload.get("workload"),
        "per_rate": rows,
        "band_rates": [r["rate"] for r in band],
        "mean_attainment_ratio_in_band": sum(r["ratio"] for r in band) / len(band) if band else None,
        "best_baseline_goodput": {"deployment": best_goodput_name, "goodput_rps": best_goodput},
        "ampd_goodput_rps": deps[ampd]["goodput_rps"],
        "goodput_ratio": deps[ampd]["goodput_rps"] / best_goodput if best_goodput > 0 else None,
    }


def load_sweep(path: Path) -> dict[str, Any]:
    """A ``sim compare`` JSON read as a typed :class:`SweepResult`, in the shape :func:`gains` takes:
    per deployment its attainment and P99 latencies per rate and, as ``goodput_rps``, DistServe's
    goodput (the result's ``max_rate_at_target``)."""
    result = SweepResult.from_dict(json.loads(path.read_text()))
    deployments = {
        name: {
            "slo_attainment": curve.attainment,
            "goodput_rps": curve.max_rate_at_target,
            "ttft_p99_s": [r.summary.ttft_p99_s for r in curve.runs],
            "tpot_p99_s": [r.summary.tpot_p99_s for r in curve.runs],
        }
        for name, curve in result.best.items()
    }
    return {"rates": list(result.rates), "workload": result.spec.workload.source, "deployments": deployments}


def merge(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """Deployments of several sweeps over the same rates; later files win on a name clash."""
    merged = dict(payloads[0])
    merged["deployments"] = {}
    for p in payloads:
        if p["rates"] != merged["rates"]:
            raise ValueError(f"sweeps have different rates: {merged['rates']} vs {p['rates']}")
        merged["deployments"].update(p["deployments"])
    return merged


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, nargs="+", help="one or more sweeps over the same rates (merged)")
    ap.add_argument("--ampd", default="ampd", help="name of the AMPD deployment in the sweep")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    try:
        payload = merge([load_sweep(p) for p in args.sweep])
        results = {"all_baselines": gains(payload, args.ampd)}
        names = [n for n in payload["deployments"] if not n.startswith("ampd")]
        if any("-offload" in n for n in names) and not all("-offload" in n for n in names):
            results["whitepaper_baselines"] = gains(payload, args.ampd, host_tier=False)
    except (OSError, KeyError, ValueError) as exc:
        print(f"ampd_gains: error: {exc}", file=sys.stderr)
        return 2
    for title, result in results.items():
        print(f"== against {title.replace('_', ' ')} ==")
        _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _print(result: dict[str, Any]) -> None:
    for r in result["per_rate"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"rate {r['rate']:>6g}: best baseline {r['best_baseline']:<20} {r['baseline_attainment']:6.1%}"
              f"  ampd {r['ampd_attainment']:6.1%}  {ratio}")
    mean = result["mean_attainment_ratio_in_band"]
    print(f"rates with the best baseline at 30-70%: {result['band_rates']}")
    print(f"mean attainment ratio there: {'-' if mean is None else f'{mean:.2f}x'}")
    g = result["goodput_ratio"]
    print(f"goodput (max rate at 90%): ampd {result['ampd_goodput_rps']:.2f}/s vs "
          f"{result['best_baseline_goodput']['deployment']} {result['best_baseline_goodput']['goodput_rps']:.2f}/s"
          f" = {'-' if g is None else f'{g:.2f}x'}")
    ttft = [(r["rate"], r["ampd_ttft_p99_s"], r["baseline_ttft_p99_s"]) for r in result["per_rate"] if r["ampd_attainment"] >= 0.9]
    for rate, mine, theirs in ttft:
        print(f"P99 TTFT at {rate:g}/s (ampd >= 90%): ampd {mine:.2f}s vs best baseline {theirs:.2f}s")


if __name__ == "__main__":
    sys.exit(main())
