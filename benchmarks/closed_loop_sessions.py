"""Per-session outcomes of a live ``benchmarks/closed_loop.py`` run against the simulator's draws of
the same workload: where live and simulated differ systematically rather than by chance.

For each mode and tier: sessions abandoned and turns served live, against the mean and standard
deviation of the same over the simulated draws (``spec.draws`` jittered draws per cell, as the
benchmark's simulated figure); for the sessions abandoned live, how often the simulator abandons
them too; and, over the turns both served at their first attempt in draw 0, the mean difference of
TTFT and of finish time (engine and HTTP timing).

    python benchmarks/closed_loop_sessions.py out/closed_loop_live1.json [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from closed_loop import MODES, OverloadSpec, cell_specs, jittered

from tokenomy.core import SLO
from tokenomy.metrics.report import write_json
from tokenomy.sim import simulate


def _outcomes(rows: list[tuple[str, float | None, float | None]]) -> dict[str, int]:
    """Session id -> turns served, from ``(request id 'session:turn', TTFT, finish)``."""
    out: dict[str, int] = {}
    for rid, _, finish in rows:
        sid = rid.rsplit(":", 1)[0]
        out[sid] = out.get(sid, 0) + (finish is not None)
    return out


def _mean_sd(v: list[float]) -> list[float]:
    m = sum(v) / len(v)
    return [round(m, 2), round(math.sqrt(sum((x - m) ** 2 for x in v) / max(1, len(v) - 1)), 2)]


def compare(run: dict[str, Any]) -> dict[str, Any]:
    spec = OverloadSpec(**{**run["spec"], "slo": SLO(**run["spec"]["slo"])})
    out: dict[str, Any] = {}
    for m in MODES:
        live_served: dict[str, int] = {}
        sim_served: list[dict[str, int]] = [{} for _ in range(spec.draws)]
        turns: dict[str, tuple[str, int]] = {}
        timing: list[tuple[float, float]] = []
        for i, cell in enumerate(cell_specs(spec)):
            sessions = cell.sessions(run["rate_per_s"])
            turns.update({f"c{i}/{x.session_id}": (x.tier, len(x.turns)) for x in sessions})
            rows = [(r[0], r[3], r[4]) for r in run["live_health"][m]["cells"][i]["records"]]
            live_served.update({f"c{i}/{k}": v for k, v in _outcomes(rows).items()})
            live_by_id = {r[0]: r for r in run["live_health"][m]["cells"][i]["records"]}
            for k in range(spec.draws):
                res = simulate(jittered(cell, sessions, k), cell.sim_config(m), cell.slo)
                served = _outcomes([(r.request_id, r.ttft_s, r.finish_s if r.finished else None) for r in res.records])
                sim_served[k].update({f"c{i}/{sid}": v for sid, v in served.items()})
                if k == 0:
                    for r in res.records:
                        lv = live_by_id.get(r.request_id)
                        if lv and lv[3] is not None and r.ttft_s is not None and lv[3] < 2.0 and r.ttft_s < 2.0:
                            timing.append((lv[3] - r.ttft_s, (lv[4] - lv[2]) - (r.finish_s - r.arrival_s)))
        by_tier: dict[str, Any] = {}
        for tier in sorted({t for t, _ in turns.values()}):
            ids = [sid for sid, (t, _) in turns.items() if t == tier]

            def abandoned(served: dict[str, int], ids: list[str] = ids,
                          turns: dict[str, tuple[str, int]] = turns) -> list[str]:
                return [sid for sid in ids if served.get(sid, 0) < turns[sid][1]]

            live_ab = abandoned(live_served)
            p_sim = {sid: sum(sid in abandoned(d) for d in sim_served) / spec.draws for sid in live_ab}
            by_tier[tier] = {
                "sessions": len(ids),
                "abandoned_live": len(live_ab),
                "abandoned_sim_mean_sd": _mean_sd([len(abandoned(d)) for d in sim_served]),
                "turns_served_live": sum(live_served.get(sid, 0) for sid in ids),
                "turns_served_sim_mean_sd": _mean_sd([sum(d.get(sid, 0) for sid in ids) for d in sim_served]),
                "sim_p_abandon_of_live_abandoned_mean": round(sum(p_sim.values()) / len(p_sim), 3) if p_sim else None,
            }
        out[m] = {"by_tier": by_tier, "first_attempt_pairs": len(timing),
                  "ttft_live_minus_sim_mean_s": round(sum(a for a, _ in timing) / len(timing), 4) if timing else None,
                  "e2e_live_minus_sim_mean_s": round(sum(b for _, b in timing) / len(timing), 4) if timing else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a live run's JSON (benchmarks/closed_loop.py --json)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    run = json.loads(args.run.read_text())
    if "live_health" not in run:
        print(f"closed_loop_sessions: {args.run} has no live run", file=sys.stderr)
        return 2
    out = compare(run)
    print(json.dumps(out, indent=1))
    if args.json:
        print(f"wrote {write_json(args.json, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
