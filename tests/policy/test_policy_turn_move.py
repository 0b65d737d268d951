"""Per-turn placement across decode instances (twelfth round): a turn leaves its bound instance
when it would queue there behind prefill work and another instance starts it sooner, move
included; and the output-length quantile the forward-looking TPOT bank reads."""

from __future__ import annotations

import pytest
from policy_fakes import FakeView, make_request

from tokenomy.policy.ampd.output_lengths import OutputLengthConfig, OutputLengths
from tokenomy.policy.ampd.turn_move import TurnMoveConfig, choose_turn_move

STEP_S = 0.4  # one full prefill step
TURN = make_request(prompt_tokens=20_000, history_tokens=18_000, max_output_tokens=200)


def queue_s(view: FakeView) -> float:
    return view.num_waiting_tokens / 8192 * STEP_S


def choose(bound: FakeView, others: list[FakeView], move_s: float = 0.1):  # type: ignore[no-untyped-def]
    return choose_turn_move(TURN, bound, others, queue_s=queue_s, move_s=lambda v: move_s,
                            margin_s=STEP_S, config=TurnMoveConfig())


def test_a_turn_queued_behind_prefill_work_moves_to_an_idle_instance_with_room() -> None:
    bound = FakeView("d0", num_waiting=1, num_waiting_tokens=30_000, free_blocks=5_000, total_blocks=5_000)
    idle = FakeView("d1", free_blocks=5_000, total_blocks=5_000)
    busy = FakeView("d2", num_running=9, free_blocks=5_000, total_blocks=5_000)
    move = choose(bound, [busy, idle])
    assert move.to_instance == "d1"  # equally soon, fewer running
    assert move.stay_s == pytest.approx(30_000 / 8192 * STEP_S) and move.go_s == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("bound_tokens", "other", "move_s", "why"),
    [
        (4_000, FakeView("d1", free_blocks=5_000, total_blocks=5_000), 0.0, "bound queue within one step"),
        (30_000, FakeView("d1", free_blocks=1_500, total_blocks=5_000), 0.1, "no room for the whole context"),
        (30_000, FakeView("d1", num_waiting=1, free_blocks=5_000, total_blocks=5_000), 0.1, "target has waiters"),
        (30_000, FakeView("d1", free_blocks=5_000, total_blocks=5_000), 1.2, "the move is not sooner by a step"),
    ],
)
def test_a_turn_stays_when_moving_does_not_start_it_sooner_by_the_margin(
    bound_tokens: int, other: FakeView, move_s: float, why: str
) -> None:
    bound = FakeView("d0", num_waiting=1, num_waiting_tokens=bound_tokens, free_blocks=5_000, total_blocks=5_000)
    assert choose(bound, [other], move_s).to_instance is None, why


def test_the_output_quantile_is_learned_from_finished_turns_in_a_sliding_window() -> None:
    lengths = OutputLengths(OutputLengthConfig(quantile=0.1, window=100, min_samples=20))
    for n in range(1, 20):
        lengths.observe(n * 10)
    assert lengths.expected_tokens() == 0  # too few turns finished: no forward bank yet
    lengths.observe(200)
    assert lengths.expected_tokens() == 20  # the 10% quantile of 10, 20, ..., 200 (index 1)
    for _ in range(100):  # the window slides: only the last 100 (all 1000) count
        lengths.observe(1000)
    assert len(lengths) == 100 and lengths.expected_tokens() == 1000
    with pytest.raises(ValueError):
        OutputLengthConfig(min_samples=0)
