"""Slack-ordered admission on a memory-full decode instance, on hand-built tasks."""

from __future__ import annotations

import random

from policy_fakes import LinearEstimator

from tokenomy.core import SLO
from tokenomy.policy.ampd import AdmissionTask, SlackAdmission

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)


def task(rid: str, arrival_s: float, *, prefill: int = 1000, blocks: int = 10) -> AdmissionTask:
    return AdmissionTask(rid, arrival_s, prefill, 0, blocks)


def decide(queue: list[AdmissionTask], now: float, **kw: int) -> str | None:
    args = {"engine_waiting": 0, "engine_waiting_blocks": 0, "free_blocks": 0} | kw
    d = SlackAdmission(LinearEstimator()).decide(queue, slo=SLO_, now=now, **args)
    return None if d is None else d.request_id


def test_a_turn_that_can_still_meet_its_ttft_goes_before_an_older_hopeless_one() -> None:
    # "old" arrived 5 s ago: its TTFT is lost whatever happens; "fresh" can still make 2 s
    assert decide([task("old", 0.0), task("fresh", 4.9)], now=5.0) == "fresh"


def test_among_turns_that_can_still_make_it_the_tightest_goes_first() -> None:
    queue = [task("loose", 4.9), task("tight", 3.5), task("hopeless", 0.0)]
    assert decide(queue, now=5.0) == "tight"


def test_the_prefill_still_to_compute_counts_against_the_slack() -> None:
    # 1.5 s left: a remote turn whose KV arrived (nothing to compute) still makes it, a local
    # turn with 20k tokens to prefill (2 s at 1e-4 s a token) does not, so it goes last
    queue = [task("local-big", 3.5, prefill=20_000), task("remote", 3.5, prefill=0), task("later", 3.9)]
    assert decide(queue, now=4.0) == "remote"
    assert decide([queue[0], queue[2]], now=4.0) == "later"


def test_hopeless_turns_go_last_oldest_first() -> None:
    assert decide([task("b", 1.0), task("a", 0.0)], now=10.0) == "a"


def test_the_engine_keeps_one_waiting_turn_until_memory_frees() -> None:
    queue = [task("a", 4.9, blocks=10)]
    assert decide(queue, now=5.0, engine_waiting=1, engine_waiting_blocks=10, free_blocks=15) is None
    assert decide(queue, now=5.0, engine_waiting=1, engine_waiting_blocks=10, free_blocks=20) == "a"
    assert decide(queue, now=5.0, engine_waiting=0, free_blocks=0) == "a"  # nothing waits: the engine queues it
    assert decide([], now=5.0) is None


def test_the_pick_is_the_least_key_of_hopelessness_slack_or_arrival_and_queue_position() -> None:
    """The one-pass pick equals the written rule on random queues, ties included (slacks and
    arrivals drawn from a few values, so equal keys are common): the first of the least slack
    that can still make it, else the first of the oldest hopeless."""
    rng = random.Random(7)
    admission = SlackAdmission(LinearEstimator())
    for _ in range(500):
        queue = [AdmissionTask(f"t{i}", rng.choice([0.0, 1.0, 2.5, 3.0]), rng.choice([0, 0, 5000, 20_000]), 0, 1)
                 for i in range(rng.randint(1, 12))]
        now = rng.choice([3.0, 4.0, 6.0])
        slacks = [admission.slack_s(t, SLO_, now) for t in queue]
        want = min(range(len(queue)),
                   key=lambda i: (slacks[i] < 0, slacks[i] if slacks[i] >= 0 else queue[i].arrival_s, i))
        d = admission.decide(queue, engine_waiting=0, engine_waiting_blocks=0, free_blocks=0, slo=SLO_, now=now)
        assert d is not None and (d.index, d.request_id) == (want, queue[want].request_id)
        assert d.slack_s == slacks[want]
