"""Helpers of the real-vLLM tests: the gateway process, metric deltas (fixtures: conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.launch import serving
from helpers.polling import wait_for
from helpers.ports import free_port_base
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.routing.backends import parse_prometheus
from tokenomy.vllm.launch import find_vllm_python

MODEL = "tiny"
"""The served model name of every instance (and of the emulator in the conformance suite)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def need_vllm_python() -> str:
    try:
        return find_vllm_python()
    except ValueError as exc:
        if in_ci():
            pytest.fail(f"real vLLM is required under CI: {exc}")
        pytest.skip(f"real vLLM is not installed ({exc})")


@contextmanager
def gateway(tmp_path: Path, backends: list[dict[str, str]], routing: dict[str, Any] | None = None,
            log_level: str = "warning") -> Iterator[tuple[str, str]]:
    """``python -m tokenomy.gateway`` in front of ``backends`` (id, url, role); yields (its URL, an API
    key); always stopped. Its log: ``tmp_path/gateway.log``."""
    key = new_api_key()
    port = free_port_base(1)
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(json.dumps({
        "server": {"port": port},
        "backends": [{**b, "models": [MODEL]} for b in backends],
        "routing": routing or {"mode": "colocated"},
        "health": {"interval_s": 0.5, "timeout_s": 10.0},  # vLLM CPU on a loaded machine answers slowly
        "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
        "ops": {"server_secret": "real-vllm-secret-0123", "reservations": "memory", "tenants": [
            {"org": "o", "teams": [{"name": "t", "keys": [{"name": "k", "key": key}]}]}]},
    }))
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg), "--log-level", log_level]
    with (
        (tmp_path / "gateway.log").open("ab") as log,
        # 90 s: its first health round waits on vLLM CPU, which answers slowly on a loaded machine
        serving(argv, url, "the gateway", timeout_s=90, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path),
    ):
        yield url, key


def scrape(url: str) -> dict[str, float]:
    """A server's ``/metrics``, each name summed over its label sets."""
    return parse_prometheus(httpx.get(url + "/metrics", timeout=10).text)


def scrape_after(urls: dict[str, str], before: dict[str, dict[str, float]], generated: int,
                 on: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Every server's :func:`scrape`, once the servers ``on`` have together counted ``generated``
    more output tokens than in ``before``. vLLM records a request's counters after it answers (its
    output handler yields to the answering task before recording), so a scrape just after an
    answer can miss the answer's last tokens on a loaded machine."""
    name = "vllm:generation_tokens_total"

    def settled() -> dict[str, dict[str, float]] | None:
        after = {i: scrape(u) for i, u in urls.items()}
        done = sum(after[i].get(name, 0.0) - before[i].get(name, 0.0) for i in on) >= generated
        return after if done else None

    return wait_for(settled, timeout_s=30.0, interval_s=0.1, what=f"{generated} generated tokens counted on {on}")


def moved(before: dict[str, float], after: dict[str, float], *names: str) -> dict[str, float]:
    return {n: after.get(n, 0.0) - before.get(n, 0.0) for n in names}


def gateway_tokens(url: str) -> dict[str, int]:
    """The gateway's metered tokens by class (``tokenomy_gateway_tokens_total``)."""
    out: dict[str, int] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tokenomy_gateway_tokens_total{"):
            labels, _, value = line.rpartition(" ")
            cls = labels.split('token_class="')[1].split('"')[0]
            out[cls] = out.get(cls, 0) + int(float(value))
    return out
