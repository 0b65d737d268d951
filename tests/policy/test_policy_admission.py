"""Slack-ordered admission on a memory-full decode instance, on hand-built tasks."""

from __future__ import annotations

from policy_fakes import LinearEstimator

from tokenomy.core import SLO
from tokenomy.policy.ampd import AdmissionTask, SlackAdmission
from tokenomy.policy.ampd.admission import lender_chunk_tokens

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


def test_a_hopeless_turn_is_overtaken_at_most_three_times() -> None:
    # "old" is late; fresh turns with slack keep coming and go first, until it has been
    # overtaken three times: then it goes (without the cap it would wait as long as they come)
    policy = SlackAdmission(LinearEstimator(), max_overtakes=3)
    old = task("old", 0.0)
    released = []
    for k in range(5):
        queue = [old, task(f"fresh{k}", 9.9)]
        d = policy.decide(queue, engine_waiting=0, engine_waiting_blocks=0, free_blocks=0, slo=SLO_, now=10.0)
        assert d is not None
        released.append(d.request_id)
        if d.request_id == "old":
            break
    assert released == ["fresh0", "fresh1", "fresh2", "old"]
    uncapped = SlackAdmission(LinearEstimator())  # the default: no cap
    late = task("late", 0.0, blocks=10)
    late.overtaken = 99
    assert uncapped.decide([late, task("fresh", 9.9)], engine_waiting=0, engine_waiting_blocks=0, free_blocks=0,
                           slo=SLO_, now=10.0).request_id == "fresh"  # type: ignore[union-attr]


def test_a_remote_turn_is_lent_only_once_its_deadline_passed_and_the_lender_has_the_memory() -> None:
    policy = SlackAdmission(LinearEstimator(), lend_late=True)
    remote = task("r", 0.0, prefill=0, blocks=10)  # its KV arrived: TTFT due at 2.0 s

    def lend(t: AdmissionTask, now: float, free: int = 100, need: int = 30, backlog: int = 0) -> bool:
        return policy.lend(t, lender_free_blocks=free, lender_blocks=need, lender_backlog_blocks=backlog,
                           slo=SLO_, now=now) is not None

    assert not lend(remote, 1.9)  # it can still make its TTFT here
    assert lend(remote, 2.0)
    assert not lend(remote, 3.0, free=29)  # the lender cannot hold it
    assert not lend(remote, 3.0, free=100, backlog=71)  # ... beside the prompts waiting for it
    assert lend(remote, 3.0, free=100, backlog=70)
    assert not lend(task("local", 0.0, prefill=500), 3.0)  # a local turn has no prefill node's KV
    off = SlackAdmission(LinearEstimator())  # the default: not lent
    assert off.lend(remote, lender_free_blocks=100, lender_blocks=30, slo=SLO_, now=3.0) is None


def test_a_held_remote_turn_is_borrowed_at_once_only_within_what_the_lender_can_spare() -> None:
    policy = SlackAdmission(LinearEstimator(), borrow=True)  # lends at most half its KV (the default)
    remote = task("r", 0.0, prefill=0, blocks=10)

    def borrow(t: AdmissionTask, *, free: int = 100, need: int = 30, lent: int = 0, backlog: int = 0) -> bool:
        return policy.borrow(t, lender_free_blocks=free, lender_blocks=need, lender_total_blocks=100,
                             lender_lent_blocks=lent, lender_backlog_blocks=backlog, now=0.5) is not None

    assert borrow(remote)  # its TTFT is not due yet: borrowed anyway (its decode node cannot take it now)
    assert not borrow(remote, free=29)
    assert not borrow(remote, backlog=71)  # the lender's queued prompts keep their memory
    assert borrow(remote, lent=20) and not borrow(remote, lent=21)  # 20 + 30 = half of 100 blocks
    assert not borrow(task("local", 0.0, prefill=500))  # a local turn has no KV on a prefill node
    back = AdmissionTask("r", 0.0, 0, 1000, 10, returning=True)
    assert not borrow(back)  # already borrowed
    assert SlackAdmission(LinearEstimator()).borrow(
        remote, lender_free_blocks=100, lender_blocks=30, lender_total_blocks=100, lender_lent_blocks=0, now=0.5,
    ) is None  # off by default


def test_a_borrowed_turn_moves_back_first_but_only_into_room() -> None:
    back = AdmissionTask("back", 0.0, 0, 1000, 40, returning=True)
    fresh = task("fresh", 4.9, blocks=5)
    # Room for it: it goes before a turn that can still meet its TTFT.
    assert decide([fresh, back], now=5.0, free_blocks=40) == "back"
    # No room: it keeps streaming on its lender rather than wait in the engine, and holds the line.
    assert decide([fresh, back], now=5.0, free_blocks=39) is None
    assert decide([fresh], now=5.0, free_blocks=39) == "fresh"  # borrowing off: into the engine's wait
    borrowing = SlackAdmission(LinearEstimator(), borrow=True)
    assert borrowing.decide([fresh], engine_waiting=0, engine_waiting_blocks=0, free_blocks=4, slo=SLO_,
                            now=5.0) is None  # borrowing on: only into room
    local = task("local", 4.5, prefill=500)
    assert borrowing.reroute(local, slo=SLO_, now=5.0, prefill_instance="prefill-0") is not None
    assert borrowing.reroute(task("r", 4.5, prefill=0), slo=SLO_, now=5.0, prefill_instance="prefill-0") is None
    assert SlackAdmission(LinearEstimator()).reroute(local, slo=SLO_, now=5.0, prefill_instance="prefill-0") is None


def test_a_lender_keeps_its_borrowed_streams_within_the_tpot_slo() -> None:
    est = LinearEstimator()  # step = 10 ms + 0.1 ms per prefill token + 0.1 ms per decode
    chunk = lender_chunk_tokens(est, SLO_, decode_seqs=10, decode_context_tokens=50_000,
                                prefill_context_tokens=40_000, budget_tokens=8192)
    assert chunk == 512  # 10 + 51.2 + 1 ms <= 100 ms; 1024 tokens would take 113 ms
    assert lender_chunk_tokens(est, SLO_, decode_seqs=0, decode_context_tokens=0, prefill_context_tokens=0,
                               budget_tokens=8192) == 0  # nothing borrowed: no cap
