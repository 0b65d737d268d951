"""The emulator's PD path: concurrent KV pulls into one decode instance share its port."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from helpers.launch import emulator
from helpers.ports import free_port_base

from .conftest import metric

pytestmark = pytest.mark.integration

# A small, fast configuration: a 0.5 GB/s port, time at 1/4 of real time. A prompt of ~1,000
# tokens (128 KiB of KV each for Llama-3.1-8B) then takes ~0.26 modelled seconds alone.
PROMPT = "word " * 1000
# A pull alone takes ~0.26 s, four together ~1.05 s, eight ~2.1 s: the 1.8 s timeout cuts only the eight.
ARGS = ("--role", "decode", "--link-gbps", "0.5", "--time-scale", "0.25", "--kv-transfer-timeout", "1.8")


@pytest.fixture(scope="module")
def decode_url() -> Iterator[str]:
    with emulator(*ARGS) as url:
        yield url


def pull_body(i: int, dead_port: int) -> dict[str, object]:
    # The decode side tells the prefill side its KV was pulled; nothing listens there (a failed
    # notice is harmless: the prefill side frees the KV on its own timeout).
    return {"prompt": f"{i} {PROMPT}", "max_tokens": 2, "ignore_eos": True, "kv_transfer_params": {
        "do_remote_prefill": True, "remote_request_id": f"r{i}", "remote_host": "127.0.0.1",
        "remote_port": dead_port}}


async def pull_together(url: str, n: int, start: int) -> list[int]:
    dead = free_port_base(1)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        replies = await asyncio.gather(*(client.post("/v1/completions", json=pull_body(start + i, dead))
                                         for i in range(n)))
    return [r.status_code for r in replies]


def seconds(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric(text, "tokenomy:kv_transfer_seconds_total"), metric(text, "tokenomy:kv_transfers_total")


def test_n_concurrent_pulls_each_take_n_times_one(decode_url: str) -> None:
    n = 4
    s0, c0 = seconds(decode_url)
    assert asyncio.run(pull_together(decode_url, 1, 0)) == [200]
    s1, c1 = seconds(decode_url)
    alone = s1 - s0
    assert c1 - c0 == 1 and alone > 0.2
    assert asyncio.run(pull_together(decode_url, n, 100)) == [200] * n
    s2, c2 = seconds(decode_url)
    assert c2 - c1 == n
    mean = (s2 - s1) / n
    # Processor sharing: each takes n times as long as one (requests start a few ms apart).
    assert mean == pytest.approx(n * alone, rel=0.2)
    text = httpx.get(decode_url + "/metrics", timeout=10).text
    assert metric(text, "tokenomy:kv_transfer_wait_seconds_total") > 0.5 * (n - 1) * alone * n


def test_pulls_cut_by_the_timeout_fail_their_requests_and_are_counted(decode_url: str) -> None:
    before = metric(httpx.get(decode_url + "/metrics", timeout=10).text, "tokenomy:kv_transfer_timeouts_total")
    codes = asyncio.run(pull_together(decode_url, 8, 1000))
    text = httpx.get(decode_url + "/metrics", timeout=10).text
    assert codes == [504] * 8
    assert metric(text, "tokenomy:kv_transfer_timeouts_total") == before + 8
