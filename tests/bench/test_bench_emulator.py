"""The bench against the real emulator process (`tokenomy emulate`) on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.launch import emulator
from tokenomy.bench.text import WORDS
from tokenomy.cli.main import main
from tokenomy.workload import write_sessions

from .factories import agent_sessions


@pytest.fixture
def emulator_url() -> Iterator[str]:
    # A fast modelled clock (a hundredth of the wall time) keeps the test short.
    with emulator("--time-scale", "0.01", "--log-level", "warning") as url:
        yield url


@pytest.mark.integration
@pytest.mark.parametrize("api", ["--chat", "--completions"])
def test_bench_against_the_emulator_sees_its_prefix_cache(emulator_url: str, api: str, tmp_path: Path) -> None:
    trace, out = tmp_path / "w.jsonl", tmp_path / "b.json"
    sessions = agent_sessions(3, turns=3, sys_tokens=64, new=40, out=16, think_s=0.01, gap_s=0.0)
    write_sessions(trace, sessions)
    rc = main(["bench", "--target", emulator_url, "--workload", str(trace), "--concurrency", "3", api,
               "--json", str(out), "--quiet"])
    assert rc == 0
    d = json.loads(out.read_text())["deployments"]["bench"]
    assert d["finished"] == d["requests"] == 9 and d["errors_by_status"] == {}
    assert d["output_tokens_received"] == d["output_tokens_workload"] == 9 * 16
    # Sized with the emulator's /tokenize, chat prompts included (their template tokens come out of
    # the filler): the emulator counts exactly the workload's tokens.
    sizing = d["prompt_sizing"]
    assert sizing["source"].startswith(f"{emulator_url}/tokenize") and sizing["filler_words"] == len(WORDS)
    assert sizing["message_overhead_tokens"] == ({"system": 1, "user": 1, "assistant": 1} if api == "--chat" else {})
    assert d["prompt_tokens_mean_abs_rel_error"] == 0.0
    # Later turns re-send prompt + answer: at least their full blocks come from the cache.
    assert d["tokens"]["cache_hit_tokens"] >= sum(
        (t.prompt_tokens - t.new_tokens) // 16 * 16 - 16 for s in sessions for t in s.turns[1:])
    assert d["ttft_p50_s"] is not None and d["tpot_p50_s"] is not None
