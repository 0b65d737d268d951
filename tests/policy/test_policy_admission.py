"""Slack-ordered admission on a memory-full decode instance, on hand-built tasks."""

from __future__ import annotations

from policy_fakes import LinearEstimator

from tokenomy.core import SLO
from tokenomy.policy.ampd import AdmissionTask, SlackAdmission

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)


def task(rid: str, since_s: float, *, streaming: bool = False, prefill: int = 1000, blocks: int = 10) -> AdmissionTask:
    return AdmissionTask(rid, since_s, streaming, 0 if streaming else prefill, 0, 100, blocks)


def decide(queue: list[AdmissionTask], now: float, **kw: int) -> str | None:
    args = {"engine_waiting": 0, "engine_waiting_blocks": 0, "free_blocks": 0} | kw
    d = SlackAdmission(LinearEstimator()).decide(queue, itl_s=0.05, slo=SLO_, now=now, **args)
    return None if d is None else d.request_id


def test_a_turn_that_can_still_meet_its_ttft_goes_before_an_older_hopeless_one() -> None:
    # "old" arrived 5 s ago: its TTFT is lost whatever happens; "fresh" can still make 2 s
    assert decide([task("old", 0.0), task("fresh", 4.9)], now=5.0) == "fresh"


def test_among_turns_that_can_still_make_it_the_tightest_goes_first() -> None:
    queue = [task("loose", 4.9), task("tight", 3.5), task("hopeless", 0.0)]
    assert decide(queue, now=5.0) == "tight"


def test_hopeless_turns_go_last_oldest_first() -> None:
    assert decide([task("b", 1.0), task("a", 0.0)], now=10.0) == "a"


def test_a_streaming_turn_has_its_tpot_budget_as_slack() -> None:
    # 99 gaps of (0.1 - 0.05) s: 4.95 s of budget from its KV arrival at 0
    stream = task("stream", 0.0, streaming=True)
    assert decide([task("fresh", 3.9), stream], now=4.0) == "stream"  # 0.95 s of slack vs 1.8 s
    assert decide([stream, task("fresh", 5.9)], now=6.0) == "fresh"  # its TPOT is lost: it goes last
    assert decide([task("late", 1.0), stream], now=6.0) == "stream"  # both hopeless: oldest first


def test_the_engine_keeps_one_waiting_turn_until_memory_frees() -> None:
    queue = [task("a", 4.9, blocks=10)]
    assert decide(queue, now=5.0, engine_waiting=1, engine_waiting_blocks=10, free_blocks=15) is None
    assert decide(queue, now=5.0, engine_waiting=1, engine_waiting_blocks=10, free_blocks=20) == "a"
    assert decide(queue, now=5.0, engine_waiting=0, free_blocks=0) == "a"  # nothing waits: the engine queues it
    assert decide([], now=5.0) is None
