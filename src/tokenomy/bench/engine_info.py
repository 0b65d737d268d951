"""What a running engine says about itself, for ``tokenomy perf profile``: its KV and batching
limits (vLLM's ``vllm:cache_config_info`` metric, our emulator's ``/tokenomy/info``, ``/v1/models``),
the emulator's time scale, and Prometheus histogram totals (vLLM's inter-token histogram)."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import httpx

from tokenomy.perf.engine_calibration import EngineLimits

_INFO_LABEL = re.compile(r'(\w+)="([^"]*)"')


def read_engine_limits(target: str, client: httpx.Client, *, max_num_batched_tokens: int | None = None,
                       max_num_seqs: int | None = None) -> EngineLimits:
    """Block size and KV blocks from vLLM's ``vllm:cache_config_info`` or the emulator's
    ``/tokenomy/info``; context window from ``/v1/models``; the limits given (a profile plan's) win."""
    found = _emulator_info(target, client) or _vllm_cache_info(target, client)
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        found["max_model_len"] = client.get(f"{target}/v1/models").json()["data"][0].get("max_model_len")
    if max_num_batched_tokens is not None:
        found["max_num_batched_tokens"] = max_num_batched_tokens
    if max_num_seqs is not None:
        found["max_num_seqs"] = max_num_seqs
    return EngineLimits(**{k: v for k, v in found.items() if isinstance(v, int) and v >= 1})


def _emulator_info(target: str, client: httpx.Client) -> dict[str, Any]:
    try:
        resp = client.get(f"{target}/tokenomy/info")
        info = resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    if not isinstance(info, dict) or not info:
        return {}
    return {"block_size_tokens": info.get("block_size"), "num_gpu_blocks": info.get("num_gpu_blocks"),
            "max_num_batched_tokens": info.get("max_num_batched_tokens"), "max_num_seqs": info.get("max_num_seqs")}


def time_scale_of(target: str, client: httpx.Client) -> float:
    """Wall seconds per second of the times the engine reports: our emulator's ``time_scale``, else 1."""
    try:
        scale = client.get(f"{target}/tokenomy/info").json().get("time_scale")
    except (httpx.HTTPError, ValueError, AttributeError):
        return 1.0
    return float(scale) if isinstance(scale, int | float) and scale > 0 else 1.0


def _vllm_cache_info(target: str, client: httpx.Client) -> dict[str, Any]:
    try:
        text = client.get(f"{target}/metrics").text
    except httpx.HTTPError:
        return {}
    line = next((ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")), "")
    labels = dict(_INFO_LABEL.findall(line))
    return {"block_size_tokens": _int_or_none(labels.get("block_size")),
            "num_gpu_blocks": _int_or_none(labels.get("num_gpu_blocks"))}


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def histogram_totals(text: str, name: str) -> tuple[float, float] | None:
    """``(sum, count)`` of the Prometheus histogram ``name`` in an exposition ``text``, added over its
    label sets; None when the text has neither."""
    totals = {"_sum": 0.0, "_count": 0.0}
    seen = False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        metric, _, value = line.rpartition(" ")
        suffix = metric[len(name):].split("{", 1)[0].strip()
        if suffix in totals:
            with contextlib.suppress(ValueError):
                totals[suffix] += float(value)
                seen = True
    return (totals["_sum"], totals["_count"]) if seen else None
