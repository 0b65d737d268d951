"""What the simulator-against-a-live-engine benchmarks share (``sim_vs_emulator.py``, ``sim_vs_vllm.py``;
not part of the library): the compared figures, the check against a target's tolerances, the
printout and the JSON, and the machine's load average."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from tokenomy.metrics import Summary
from tokenomy.metrics.report import write_json

KEYS = {"ttft_p50": "ttft_p50_s", "ttft_p99": "ttft_p99_s", "tpot_p50": "tpot_p50_s", "tpot_p99": "tpot_p99_s",
        "slo_attainment": "slo_attainment"}
"""JSON key -> :class:`Summary` field; each is written as ``[sim, live]``."""

Tolerance = dict[str, tuple[Literal["rel", "abs"], float]]
"""JSON key -> ``("rel", fraction)`` or ``("abs", difference)``."""


def cached_fraction(s: Summary) -> float | None:
    prompt = s.tokens.get("prompt_tokens", 0)
    return s.tokens.get("cache_hit_tokens", 0) / prompt if prompt else None


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def compare(sim: Summary, got: Summary, tolerance: Tolerance, relative_to: Literal["sim", "live"]) -> dict[str, Any]:
    """``{key: [sim, live]}`` for every :data:`KEYS` and ``cached_fraction``, the ``targets`` as text and
    whether each was ``met`` (None: a side has no value). A relative tolerance is a fraction of the
    ``relative_to`` side's value."""
    out: dict[str, Any] = {k: [getattr(sim, attr), getattr(got, attr)] for k, attr in KEYS.items()}
    out["cached_fraction"] = [cached_fraction(sim), cached_fraction(got)]
    met: dict[str, bool | None] = {}
    for key, (kind, tol) in tolerance.items():
        a, b = out[key]
        if a is None or b is None:
            met[key] = None
        elif kind == "abs":
            met[key] = abs(a - b) <= tol
        else:
            met[key] = abs(b - a) <= tol * abs(b if relative_to == "live" else a)
    out["targets"] = {k: f"±{tol:g} relative to {relative_to}" if kind == "rel" else f"+-{tol:g}"
                      for k, (kind, tol) in tolerance.items()}
    out["met"] = met
    return out


def report(out: dict[str, Any], path: Path | None) -> None:
    """Print each compared figure with whether it met its target, write ``out`` to ``path`` (when
    given) and print the compared figures as one JSON line."""
    for key in (*KEYS, "cached_fraction"):
        a, b = out[key]
        print(f"{key:16s} sim {a!s:>24s}  live {b!s:>24s}  met {out['met'].get(key, '-')}")
    if path:
        write_json(path, out)
        print(f"wrote {path}")
    print(json.dumps({k: out[k] for k in (*KEYS, "cached_fraction", "met")}))
