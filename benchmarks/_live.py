"""The live benchmarks' shared launcher (not part of the library): ``tokenomy up`` (emulated
engines) behind ``tokenomy serve``, each engine's health afterwards, and the engine shape both
the simulated and the live run are built from (``ampd_live.py``, ``closed_loop.py``)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _emulated import _stop, cluster, free_port

from tokenomy.gateway.routing.backends import parse_prometheus


@dataclass(frozen=True)
class EngineShape:
    """What every emulated instance of a live benchmark runs (labelled choices: each benchmark's
    docstring says why): the model on one GPU type, its tensor parallelism, the KV memory share
    and the context window."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    gpu_memory_utilization: float = 0.8
    max_model_len: int = 131072

    def up_file(self, pools: list[dict[str, Any]]) -> dict[str, Any]:
        """``tokenomy up``'s cluster file with ``pools``."""
        engine = {"gpu_memory_utilization": self.gpu_memory_utilization, "max_model_len": self.max_model_len}
        return {"model": self.model, "gpu": self.gpu, "tp": self.tp, "engine": engine, "pools": pools}


def wait_serving(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"tokenomy serve did not start (status {proc.poll()})")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)


GatewayFile = Callable[[list[str], list[int], int, Path], dict[str, Any]]
"""``gateway_file(instance urls, their KV blocks, port, tmp dir)``: ``tokenomy serve``'s config."""


@dataclass
class LiveCluster:
    """A running gateway and the instances behind it (see :func:`live_cluster`)."""

    url: str
    instance_urls: list[str]
    tmp: Path
    """The gateway's working folder (its SQLite ledger is ``ledger.db`` when the config puts it there)."""


@contextmanager
def live_cluster(up_file: dict[str, Any], gateway_file: GatewayFile) -> Iterator[LiveCluster]:
    """``tokenomy up`` with ``up_file`` on free ports, then ``tokenomy serve`` with the config
    ``gateway_file`` builds from the instances' URLs and KV blocks; yields both, always stops both."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        spec_file = tmp / "cluster.json"  # YAML is a superset of JSON
        spec_file.write_text(json.dumps(up_file))
        with cluster([str(spec_file)]) as urls:
            port = free_port()
            blocks = [int(httpx.get(u + "/tokenomy/info", timeout=5).json()["num_gpu_blocks"]) for u in urls]
            cfg = tmp / "gateway.yaml"
            cfg.write_text(json.dumps(gateway_file(urls, blocks, port, tmp)))
            gw = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg),
                                   "--log-level", "warning"], cwd=tmp)
            url = f"http://127.0.0.1:{port}"
            try:
                wait_serving(url, gw)
                yield LiveCluster(url, urls, tmp)
            finally:
                _stop(gw)


@contextmanager
def run_health() -> Iterator[dict[str, Any]]:
    """A live run's health record: the load average before and after (1, 5, 15 min) and the wall
    seconds of the ``with`` block; the block adds its own entries."""
    health: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    t0 = time.monotonic()
    try:
        yield health
    finally:
        health["wall_s"] = round(time.monotonic() - t0, 1)
        health["loadavg_after"] = os.getloadavg()


COUNTERS = {"tokenomy:kv_transfers_total": "kv_transfers", "tokenomy:kv_retained_requests_total": "kv_retained",
            "vllm:prompt_tokens_total": "prompt_tokens", "vllm:prefix_cache_hits_total": "prefix_cache_hit_tokens"}


def emulator_health(ids: list[str], urls: list[str]) -> dict[str, Any]:
    """Each emulator's ``/tokenomy/info`` (steps, modelled seconds busy and dropped to CPU lag)
    and ``/metrics`` counters (KV pulls, retained requests, prompt tokens, prefix-cache hits)."""
    out: dict[str, Any] = {}
    for i, u in zip(ids, urls, strict=True):
        try:
            info = httpx.get(u + "/tokenomy/info", timeout=5).json()
            out[i] = {k: info.get(k) for k in ("steps", "busy_s", "lag_dropped_s")}
            for name, value in parse_prometheus(httpx.get(u + "/metrics", timeout=5).text).items():
                if name in COUNTERS:
                    out[i][COUNTERS[name]] = value
        except (httpx.HTTPError, ValueError) as exc:
            out[i] = {"error": str(exc)}
    return out


def metric_lines(url: str) -> list[tuple[str, float]]:
    """``(name with labels, value)`` of every sample on ``url``'s ``/metrics`` (empty when unreachable)."""
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return []
    out = []
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            try:
                out.append((name, float(value)))
            except ValueError:
                continue
    return out


def spec_json(spec: object) -> dict[str, Any]:
    """A benchmark's spec (a dataclass of settings, some themselves dataclasses) for its JSON."""
    return {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v)
            for k, v in vars(spec).items()}
