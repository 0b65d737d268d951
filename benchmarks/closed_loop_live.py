"""The live half of ``benchmarks/closed_loop.py``: ``run_bench`` (each session with its tenant's key)
-> ``tokenomy serve`` (the mode's admission policy and router) -> ``tokenomy up`` (emulated engines)."""

from __future__ import annotations

import os
import time
from typing import Any

from _live import emulator_health, live_cluster, metric_lines

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import Session
from tokenomy.gateway.ops.keys import new_api_key


def _gateway_counts(url: str) -> dict[str, dict[str, float]]:
    """Deferrals and refusals by tier from the gateway's ``/metrics`` (empty when it has none)."""
    out: dict[str, dict[str, float]] = {"deferred": {}, "refused": {}}
    for name, value in metric_lines(url):
        for kind in ("deferred", "refused"):
            prefix = f"tokenomy_gateway_admission_{kind}_total{{"
            if name.startswith(prefix) and 'tier="' in name:
                tier = name.split('tier="', 1)[1].split('"', 1)[0]
                out[kind][tier] = out[kind].get(tier, 0.0) + value
    return out


def live_mode(mode: str, spec: Any, sessions: list[Session]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``mode``'s figures live (``closed_loop.figures``) and the run's health (load average before
    and after, wall time, each emulator's busy and lag-dropped seconds, the gateway's counts)."""
    from closed_loop import figures

    health: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    t0 = time.monotonic()
    keys = {t: new_api_key() for t in sorted({s.tenant for s in sessions})}
    with live_cluster(spec.cluster_file(),
                      lambda urls, blocks, port, tmp: spec.gateway_file(mode, urls, blocks, port, keys, tmp)) as live:
        rep = run_bench(sessions, BenchConfig(targets=(live.url,), model=spec.model, api="completions",
                                              slo=spec.slo, gpus=spec.instances, seed=spec.seed,
                                              tenant_keys=tuple(sorted(keys.items())), retry=spec.retry))
        health["gateway"] = _gateway_counts(live.url)
        health["emulators"] = emulator_health([f"mixed-{i}" for i in range(len(live.instance_urls))],
                                              live.instance_urls)
    health["wall_s"] = round(time.monotonic() - t0, 1)
    health["loadavg_after"] = os.getloadavg()
    health["loadavg"] = [round(health["loadavg_before"][0], 2), round(health["loadavg_after"][0], 2)]
    health["errors_by_status"] = rep.errors_by_status
    health["error_examples"] = rep.extras.get("error_examples", {})
    health["retries"], health["abandoned_turns"] = rep.extras["retries"], rep.extras["abandoned_turns"]
    out = figures(rep.summary, rep.records)
    if health["gateway"]["deferred"]:
        out["deferred_by_tier"] = {t: int(v) for t, v in health["gateway"]["deferred"].items()}
    return out, health

