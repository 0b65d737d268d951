"""Look-ahead reordering of a prefill queue, and its starvation cap."""

from __future__ import annotations

import random

import pytest
from policy_fakes import LinearEstimator

from tokenomy.policy.ampd import LookaheadReorder, PrefillTask, ReorderConfig

# LinearEstimator prefills 10k tokens per second: a task of n tokens takes n * 1e-4 s.


def reorder(window: int = 5, max_deferrals: int = 3) -> LookaheadReorder:
    return LookaheadReorder(ReorderConfig(window=window, max_deferrals=max_deferrals), LinearEstimator())


def task(rid: str, deadline_s: float, tokens: int, deferrals: int = 0) -> PrefillTask:
    return PrefillTask(
        rid, arrival_s=0.0, deadline_s=deadline_s, new_tokens=tokens, cached_tokens=0, deferrals=deferrals
    )


def test_defaults_are_the_whitepaper_window_and_documented_cap() -> None:
    assert (ReorderConfig().window, ReorderConfig().max_deferrals) == (5, 3)


def test_short_urgent_task_overtakes_a_long_lax_one() -> None:
    # long: 1 s of prefill, due at 5 s; short: 0.1 s, due at 0.5 s. FCFS would make short miss.
    queue = [task("long", 5.0, 10_000), task("short", 0.5, 1_000)]
    assert reorder().pick(queue, now=0.0) == 1
    assert [t.deferrals for t in queue] == [1, 0]


@pytest.mark.parametrize(
    ("queue", "expected", "why"),
    [
        ([task("a", 0.05, 1_000), task("b", 1.0, 1_000)], 1, "hopeless head goes after a feasible task"),
        ([task("a", 0.05, 1_000), task("b", 0.01, 1_000)], 0, "all hopeless: FCFS"),
        ([task("a", 9.0, 1_000), task("b", 0.5, 1_000, deferrals=0)], 1, "earliest feasible deadline"),
        ([task("a", 9.0, 1_000, deferrals=3), task("b", 0.5, 1_000)], 0, "a task at the cap runs first"),
        (
            [task("a", 9.0, 1_000), task("b", 9.0, 1_000, deferrals=3), task("c", 0.2, 1_000)],
            1,
            "first capped task wins over a more urgent one",
        ),
        # Moore-Hodgson: big has the earliest deadline and can make it, but running it first makes
        # both short tasks late (1 met); running the short ones first meets 2
        ([task("big", 0.6, 6_000), task("s1", 0.65, 1_000), task("s2", 0.7, 1_000)], 1, "most deadlines met"),
    ],
)
def test_pick(queue: list[PrefillTask], expected: int, why: str) -> None:
    assert reorder().pick(queue, now=0.0) == expected, why


def test_tasks_beyond_the_window_are_not_considered() -> None:
    queue = [task(f"t{i}", 100.0, 1_000) for i in range(5)] + [task("urgent", 0.2, 100)]
    assert reorder(window=5).pick(queue, now=0.0) == 0
    assert reorder(window=6).pick(queue, now=0.0) == 5


def test_zero_deferrals_is_fcfs() -> None:
    queue = [task("long", 5.0, 10_000), task("short", 0.5, 1_000)]
    assert reorder(max_deferrals=0).pick(queue, now=0.0) == 0


def test_empty_queue_and_bad_config() -> None:
    with pytest.raises(ValueError, match="empty"):
        reorder().pick([], now=0.0)
    with pytest.raises(ValueError, match="window"):
        ReorderConfig(window=0)
    with pytest.raises(ValueError, match="max_deferrals"):
        ReorderConfig(max_deferrals=-1)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("max_deferrals", [1, 3])
def test_no_task_is_overtaken_more_than_k_times(seed: int, max_deferrals: int) -> None:
    """Random arrivals on one prefill server; overtakes are counted independently of the counter."""
    rng = random.Random(seed)
    policy = reorder(window=5, max_deferrals=max_deferrals)
    queue: list[PrefillTask] = []
    order: dict[str, int] = {}  # queue order (arrival rank) of every task
    overtaken: dict[str, int] = {}
    done: set[str] = set()
    now, n_tasks, next_id = 0.0, 400, 0
    while len(done) < n_tasks:
        # a burst of 0-3 arrivals before each pick keeps the window full most of the time
        for _ in range(rng.randint(0, 3)):
            if next_id < n_tasks:
                rid = f"t{next_id}"
                tokens = rng.choice([200, 1_000, 8_000, 30_000])
                slack = rng.uniform(0.05, 4.0)
                queue.append(PrefillTask(rid, now, now + slack, tokens, rng.randint(0, 2_000)))
                order[rid], overtaken[rid] = next_id, 0
                next_id += 1
        if not queue:
            continue
        i = policy.pick(queue, now)
        assert i < 5
        ran = queue.pop(i)
        for waiting in queue:  # every queued task that arrived before `ran` was overtaken by it
            if order[waiting.request_id] < order[ran.request_id]:
                overtaken[waiting.request_id] += 1
        done.add(ran.request_id)
        now += ran.new_tokens * 1e-4
    assert max(overtaken.values()) <= max_deferrals
    assert max(overtaken.values()) == max_deferrals  # the cap is reached, so the test exercises it
    assert len(done) == n_tasks  # nobody starves
