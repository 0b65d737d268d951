"""The live half of ``benchmarks/closed_loop.py``: ``run_bench`` (each session with its tenant's key)
-> ``tokenomy serve`` (the mode's admission policy and router) -> ``tokenomy up`` (emulated engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _emulated import _stop, cluster, free_port
from ampd_live import _emulator_health, _wait_serving

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import Session
from tokenomy.gateway.ops.keys import new_api_key


def _gateway_counts(url: str) -> dict[str, dict[str, float]]:
    """Deferrals and refusals by tier from the gateway's ``/metrics`` (empty when it has none)."""
    out: dict[str, dict[str, float]] = {"deferred": {}, "refused": {}}
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        for kind in ("deferred", "refused"):
            prefix = f"tokenomy_gateway_admission_{kind}_total{{"
            if name.startswith(prefix) and 'tier="' in name:
                tier = name.split('tier="', 1)[1].split('"', 1)[0]
                out[kind][tier] = out[kind].get(tier, 0.0) + float(value)
    return out


def live_mode(mode: str, spec: Any, sessions: list[Session]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``mode``'s figures live (``closed_loop.figures``) and the run's health (load average before
    and after, wall time, each emulator's busy and lag-dropped seconds, the gateway's counts)."""
    from closed_loop import figures

    health: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        spec_file = tmp / "cluster.json"  # YAML is a superset of JSON
        spec_file.write_text(json.dumps(spec.cluster_file()))
        with cluster([str(spec_file)]) as urls:
            keys = {t: new_api_key() for t in sorted({s.tenant for s in sessions})}
            port = free_port()
            cfg = tmp / "gateway.yaml"
            blocks = [int(httpx.get(u + "/tokenomy/info", timeout=5).json()["num_gpu_blocks"]) for u in urls]
            cfg.write_text(json.dumps(spec.gateway_file(mode, urls, blocks, port, keys, tmp)))
            gw = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg),
                                   "--log-level", "warning"], cwd=tmp)
            url = f"http://127.0.0.1:{port}"
            try:
                _wait_serving(url, gw)
                rep = run_bench(sessions, BenchConfig(targets=(url,), model=spec.model, api="completions",
                                                      slo=spec.slo, gpus=spec.instances, seed=spec.seed,
                                                      tenant_keys=tuple(sorted(keys.items()))))
                health["gateway"] = _gateway_counts(url)
            finally:
                _stop(gw)
            health["emulators"] = _emulator_health([f"mixed-{i}" for i in range(len(urls))], urls)
    health["wall_s"] = round(time.monotonic() - t0, 1)
    health["loadavg_after"] = os.getloadavg()
    health["loadavg"] = [round(health["loadavg_before"][0], 2), round(health["loadavg_after"][0], 2)]
    health["errors_by_status"] = rep.errors_by_status
    health["error_examples"] = rep.extras.get("error_examples", {})
    end = max((r.finish_s for r in rep.records if r.finish_s is not None), default=0.0)
    out = figures(rep.summary, end)
    if health["gateway"]["deferred"]:
        out["deferred_by_tier"] = {t: int(v) for t, v in health["gateway"]["deferred"].items()}
    return out, health
