"""Simulator against closed forms: lone requests, light-load queueing, closed-loop turns."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.core import SLO, Session, Turn
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def one_turn(prompt: int, output: int, start_s: float = 0.0, sid: str = "s0") -> Session:
    return Session(sid, start_s, (Turn(prompt_tokens=prompt, output_tokens=output),))


@pytest.mark.parametrize("prompt", [16, 1000, 4096, 8000])
def test_lone_request_ttft_is_the_prefill_time_colocated(prompt: int) -> None:
    result = simulate([one_turn(prompt, 8)], SimConfig(deployment="colocated", instances=1), SLO(), perf=PERF)
    (rec,) = result.records
    assert rec.ttft_s == pytest.approx(PERF.prefill_time_s(prompt), rel=1e-9)
    # Each later token is one decode step of a batch of one, at a context between prompt and prompt+output.
    lo, hi = PERF.decode_step_time_s(1, prompt), PERF.decode_step_time_s(1, prompt + 8)
    assert lo * (1 - 1e-9) <= rec.tpot_s <= hi * (1 + 1e-9)


@pytest.mark.parametrize("prompt", [1000, 6000])
def test_lone_request_ttft_is_prefill_plus_transfer_plus_first_decode_step_disagg(prompt: int) -> None:
    """The client streams from the decode side (vLLM's P/D protocol): its first token is the
    decode instance's first step after the KV arrived, not the KV's arrival."""
    cfg = SimConfig(deployment="disagg", prefill=1, decode=1)
    assert cfg.link_bytes_per_s is None  # the GPU's own NIC per TP rank
    result = simulate([one_turn(prompt, 8)], cfg, SLO(), perf=PERF)
    (rec,) = result.records
    arrived = PERF.prefill_time_s(prompt) + PERF.kv_transfer_time_s(prompt)
    lo, hi = PERF.decode_step_time_s(1, prompt), PERF.decode_step_time_s(1, prompt + 2)
    assert arrived + lo * (1 - 1e-9) <= rec.ttft_s <= arrived + hi * (1 + 1e-9)
    assert rec.output_tokens == 8
    assert rec.prefill_instance == "prefill-0" and rec.decode_instance == "decode-0"


def test_a_request_arriving_during_a_prefill_step_goes_to_the_idle_prefill_instance() -> None:
    """The engine applies a step's effects at its start; the router must still see the instance
    computing it (before the fix, a one-chunk prefill looked idle and ties went to prefill-0)."""
    prompt = 4000
    first, second = one_turn(prompt, 4, 0.0, "s0"), one_turn(prompt, 4, PERF.prefill_time_s(prompt) / 4, "s1")
    result = simulate([first, second], SimConfig(deployment="disagg", prefill=2, decode=1), SLO(), perf=PERF)
    by_session = {r.session_id: r for r in result.records}
    assert (by_session["s0"].prefill_instance, by_session["s1"].prefill_instance) == ("prefill-0", "prefill-1")
    # so the second request does not wait for the first one's prefill
    assert by_session["s1"].ttft_s < by_session["s0"].ttft_s + PERF.prefill_time_s(prompt) / 2


def test_light_load_queueing_matches_md1() -> None:
    """Identical one-token jobs at utilisation rho on one instance whose token budget holds one prompt.

    Each step then serves exactly one job for S = the prefill time, FCFS: an M/D/1 queue, whose
    mean wait is rho * S / (2 (1 - rho)) (Pollaczek-Khinchine).
    """
    prompt = 2048
    service = PERF.prefill_time_s(prompt)
    rho = 0.3
    rng = np.random.default_rng(7)
    n = 4000
    starts = np.cumsum(rng.exponential(service / rho, size=n))
    sessions = [one_turn(prompt, 1, float(t), f"s{i}") for i, t in enumerate(starts)]
    cfg = SimConfig(deployment="colocated", instances=1, max_num_batched_tokens=prompt)
    result = simulate(sessions, cfg, SLO(), perf=PERF)
    ttft = np.array([r.ttft_s for r in result.records])
    md1_wait = rho * service / (2 * (1 - rho))
    assert ttft.min() == pytest.approx(service, rel=1e-9)
    assert ttft.mean() - service == pytest.approx(md1_wait, rel=0.15)


def test_next_turn_arrives_after_answer_plus_think_time() -> None:
    turns = (
        Turn(prompt_tokens=500, output_tokens=20, content=((1, 500), (2, 20))),
        Turn(prompt_tokens=900, output_tokens=10, history_tokens=520, think_time_s=3.5, content=((1, 500), (2, 410))),
    )
    result = simulate([Session("a", 0.0, turns)], SimConfig(deployment="colocated", instances=1), SLO(), perf=PERF)
    first, second = sorted(result.records, key=lambda r: r.turn)
    assert first.finish_s is not None
    assert second.arrival_s == pytest.approx(first.finish_s + 3.5)
    # The second turn re-reads the first turn's prompt and answer from the prefix cache.
    assert second.usage.cache_hit_tokens >= 512
    assert second.usage.incremental_prefill_tokens == 380 and second.usage.history_tokens == 520


@pytest.mark.parametrize("deployment", ["colocated", "disagg"])
def test_fixed_seed_gives_identical_output(deployment: str) -> None:
    from tokenomy.workload.registry import load_workload

    def run() -> list[tuple[object, ...]]:
        sessions = load_workload("toolbench", rate_per_s=2.0, duration_s=20.0, seed=3)
        res = simulate(sessions, SimConfig(deployment=deployment, instances=2, prefill=1, decode=1), SLO(), perf=PERF)
        return sorted((r.request_id, r.first_token_s, r.finish_s, r.output_tokens) for r in res.records)

    assert run() == run()


@pytest.mark.parametrize("deployment", ["colocated", "disagg"])
def test_every_request_recorded_once_with_exact_token_classes(deployment: str) -> None:
    from tokenomy.workload.registry import load_workload

    sessions = load_workload("gaia", rate_per_s=0.5, duration_s=30.0, seed=1)
    res = simulate(sessions, SimConfig(deployment=deployment, instances=2, prefill=1, decode=1), SLO(), perf=PERF)
    ids = [r.request_id for r in res.records]
    assert len(ids) == len(set(ids)) == sum(len(s.turns) for s in sessions)
    for rec in res.records:
        assert rec.finished
        rec.usage.check()
        assert rec.usage.prompt_tokens == rec.prompt_tokens
        assert rec.output_tokens == rec.usage.output_tokens
