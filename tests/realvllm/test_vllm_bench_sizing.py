"""`tokenomy bench` and `tokenomy perf profile` against real vLLM (the shared instances of conftest.py):
prompts sized with vLLM's own /tokenize hit the workload's token counts, chat template included,
and the profiler reads vLLM's engine limits and writes a calibration the simulator runs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tokenomy.cli.main import main
from tokenomy.core import SLO, Session
from tokenomy.perf.engine_calibration import load_calibration
from tokenomy.sim import SimConfig, simulate
from tokenomy.workload import StreamKeys, write_sessions
from tokenomy.workload.build import grow_turns

pytestmark = pytest.mark.integration


def _agent_file(path: Path) -> Path:
    """Three 3-turn agent sessions sharing a system prompt (tool results and answers in the history)."""
    keys = StreamKeys()
    sys_key = keys.new()
    sessions = [Session(f"s{i}", 0.0, grow_turns(sys_key, 96, keys.new(), [60 + 7 * i, 40, 50], [12, 12, 12],
                                                 [0.01] * 3)) for i in range(3)]
    write_sessions(path, sessions)
    return path


@pytest.mark.parametrize("api", ["--chat", "--completions"])
def test_bench_prompts_hit_the_workloads_token_counts_on_vllm(
        vllm_urls: dict[str, str], tiny_model: Path, api: str, tmp_path: Path) -> None:
    url = vllm_urls["decode-1"]
    out = tmp_path / "bench.json"
    # A seed of its own: the shared instances' prefix caches hold other tests' prompts.
    rc = main(["bench", "--target", url, "--workload", str(_agent_file(tmp_path / "w.jsonl")), "--concurrency", "3",
               api, "--seed", "1717", "--json", str(out), "--quiet"])
    assert rc == 0
    d = json.loads(out.read_text())["deployments"]["bench"]
    assert d["finished"] == d["requests"] == 9 and d["errors_by_status"] == {}
    sizing = d["prompt_sizing"]
    assert sizing["source"].startswith(f"{url}/tokenize")
    if api == "--chat":  # the tiny model's Llama-3 layout: header and end-of-turn tokens per message
        assert sizing["message_overhead_tokens"]["user"] > 0 and sizing["prompt_overhead_tokens"] > 0
    sent, workload = d["prompt_tokens_sent"], d["prompt_tokens_workload"]
    assert abs(sent - workload) <= 0.02 * workload, (sent, workload)
    # Later turns re-send turn 0's prompt and answer byte for byte: vLLM serves them from its cache.
    assert d["tokens"]["cache_hit_tokens"] > 0


def test_profile_reads_vllms_limits_and_the_simulator_runs_the_calibration(
        vllm_urls: dict[str, str], tiny_model: Path, tmp_path: Path) -> None:
    url = vllm_urls["decode-1"]
    out = tmp_path / "cal.json"
    rc = main(["perf", "profile", "--target", url, "--out", str(out), "--prompt-tokens", "32,256,1024,2048",
               "--batches", "1,4", "--contexts", "256", "--decode-tokens", "16", "--repeats", "1",
               "--max-num-batched-tokens", "2048", "--quiet"])
    assert rc == 0
    cal = load_calibration(out)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    info = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert f'block_size="{cal.engine.block_size_tokens}"' in info
    assert f'num_gpu_blocks="{cal.engine.num_gpu_blocks}"' in info
    assert cal.engine.max_model_len == 4096 and cal.engine.max_num_batched_tokens == 2048
    assert cal.fit["points"] == len(cal.measurements) == 8
    assert {m.kind for m in cal.measurements} == {"prefill", "decode"}
    # Both decode points timed by vLLM's engine-stamped inter-token histogram, every gap counted.
    assert cal.fit["decode_timing"] == {"engine": 2, "client": 0}
    # vLLM counted the probes' prompts in its own tokens (sized to the plan by its /tokenize); the
    # single stream's 16-token tail came after the 256-token context it had just cached.
    prefills = sorted((m.steps[0].prefill_tokens, m.steps[0].prefill_context_tokens)
                      for m in cal.measurements if m.kind == "prefill")
    assert prefills == [(16, 272), (32, 32), (256, 256), (256, 256), (1024, 1024), (2048, 2048)]
    session = Session("s", 0.0, (*grow_turns(1, 300, 2, [100, 80], [10, 10], [0.5, 0.5]),))
    result = simulate([session], SimConfig(instances=1, model=str(tiny_model / "config.json"),
                                           calibration=str(out)), SLO())
    assert result.config.block_size_tokens == cal.engine.block_size_tokens
    assert [r.finished for r in result.records] == [True, True]
