"""The openai SDK through the gateway to real emulators: a scripted 5-turn agent session.

Each turn's ledger row is checked against what the serving backend itself counted (its
``/metrics`` counters before and after the turn, vLLM names), streamed or not, with or without
usage asked for: input, incremental prefill, output, cached and recomputed tokens.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.gateway_core_support import free_port, serve
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.routing.backends import parse_prometheus
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration
openai = pytest.importorskip("openai")

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def emulators() -> Iterator[list[str]]:
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, "-m", "tokenomy.emulator", "--port", str(p), "--time-scale", "0.1",
                               "--instance-id", f"emu{i}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
             for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url, proc in zip(urls, procs, strict=True):
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, "emulator exited"
                assert time.monotonic() < deadline, "emulator not healthy in 60s"
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _counters(urls: list[str]) -> dict[str, float]:
    total: dict[str, float] = {}
    for url in urls:
        for name, value in parse_prometheus(httpx.get(url + "/metrics").text).items():
            total[name] = total.get(name, 0.0) + value
    return total


def test_five_turn_agent_session_through_the_openai_sdk(emulators: list[str], tmp_path: Path) -> None:
    cfg = config_from_dict({
        "backends": [{"id": f"emu{i}", "url": u} for i, u in enumerate(emulators)],
        "router": {"name": "session_affinity"},
        "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
    })
    ledger = SqlLedger(cfg.ledger.url)
    keys = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total")
    backend_counts: list[dict[str, int]] = []
    seen_usage: list[object] = []
    try:
        with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", default_headers={"x-session-id": "agent-7"})
            messages = [{"role": "system", "content": "You are a tool-using agent. " * 40},
                        {"role": "user", "content": "Find the cheapest flight and book it."}]
            for turn in range(5):
                before = _counters(emulators)
                kwargs = {"model": MODEL, "messages": messages, "max_tokens": 12 + 3 * turn,
                          "extra_body": {"ignore_eos": True}}
                if turn in (1, 3):  # streamed, usage stripped by the gateway (client did not ask)
                    chunks = list(client.chat.completions.create(stream=True, **kwargs))
                    assert all(getattr(c, "usage", None) is None for c in chunks)
                    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                elif turn == 4:  # streamed with usage
                    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                                 **kwargs))
                    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    seen_usage.append(chunks[-1].usage)
                else:
                    resp = client.chat.completions.create(**kwargs)
                    answer = resp.choices[0].message.content or ""
                    seen_usage.append(resp.usage)
                after = _counters(emulators)
                backend_counts.append({k: round(after.get(k, 0) - before.get(k, 0)) for k in keys})
                messages.append({"role": "assistant", "content": answer})
                messages.append({"role": "user", "content": f"Tool result {turn}: " + "fare data " * (5 + turn)})
        events = ledger.query(UsageFilter(session_id="agent-7"))
    finally:
        ledger.close()

    assert [e.turn for e in events] == [0, 1, 2, 3, 4]
    assert len({e.backend for e in events}) == 1  # session affinity kept the agent on one instance
    prev = None
    for ev, counted in zip(events, backend_counts, strict=True):
        assert ev.prompt_tokens == counted["vllm:prompt_tokens_total"]
        assert ev.output_tokens == counted["vllm:generation_tokens_total"] == 12 + 3 * ev.turn
        assert ev.cached_tokens == counted["vllm:prefix_cache_hits_total"]
        assert ev.recomputed_tokens == ev.prompt_tokens - ev.cached_tokens
        if prev is None:
            assert (ev.input_tokens, ev.incremental_prefill_tokens, ev.history_tokens) == (ev.prompt_tokens, 0, 0)
        else:
            carried = prev.prompt_tokens + prev.output_tokens
            assert (ev.input_tokens, ev.history_tokens) == (0, carried)
            assert ev.incremental_prefill_tokens == ev.prompt_tokens - carried > 0
            assert ev.cached_tokens > 0  # the previous turn's prompt + answer hit the prefix cache
        prev = ev
    for usage, ev in zip(seen_usage, [events[0], events[2], events[4]], strict=True):
        assert (usage.prompt_tokens, usage.completion_tokens) == (ev.prompt_tokens, ev.output_tokens)  # type: ignore[attr-defined]
        assert usage.prompt_tokens_details.cached_tokens == ev.cached_tokens  # type: ignore[attr-defined]
