"""Prompt text: the target sees the workload's sizes and sharing."""

from __future__ import annotations

import pytest

from tokenomy.bench.text import PromptBuilder, StreamText
from tokenomy.core import Session, Turn

from .factories import agent_sessions
from .fakes import tokens


def test_prompt_has_the_workloads_token_count() -> None:
    sessions = agent_sessions(2)
    b = PromptBuilder(sessions)
    for s in sessions:
        prompt, _ = b.prompt(s.turns[0])
        assert len(tokens(prompt.text)) == s.turns[0].prompt_tokens


def test_system_prompt_is_byte_identical_across_sessions_and_the_rest_differs() -> None:
    sessions = agent_sessions(2, sys_tokens=40)
    b = PromptBuilder(sessions)
    p0, _ = b.prompt(sessions[0].turns[0])
    p1, _ = b.prompt(sessions[1].turns[0])
    assert p0.messages[0]["role"] == p1.messages[0]["role"] == "system"
    assert p0.messages[0]["content"] == p1.messages[0]["content"]
    assert len(tokens(p0.messages[0]["content"])) == 40
    assert p0.messages[1]["role"] == "user"
    assert tokens(p0.messages[1]["content"])[:4] != tokens(p1.messages[1]["content"])[:4]


def test_next_turn_resends_prompt_and_answer_verbatim() -> None:
    (s,) = agent_sessions(1, turns=3, new=20, out=8)
    b = PromptBuilder([s])
    p0, c0 = b.prompt(s.turns[0])
    answer = " alpha beta gamma delta epsilon zeta eta theta"
    b.record_answer(s.turns[0], c0, answer)
    p1, _ = b.prompt(s.turns[1])
    assert p1.text.startswith(p0.text + answer)
    assert len(tokens(p1.text)) == s.turns[1].prompt_tokens
    roles = [m["role"] for m in p1.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert p1.messages[2]["content"] == answer


def test_same_seed_same_text_other_seed_other_text() -> None:
    sessions = agent_sessions(1)
    a, _ = PromptBuilder(sessions, seed=1).prompt(sessions[0].turns[0])
    b, _ = PromptBuilder(sessions, seed=1).prompt(sessions[0].turns[0])
    c, _ = PromptBuilder(sessions, seed=2).prompt(sessions[0].turns[0])
    assert a.text == b.text != c.text


def test_turn_without_content_gets_its_own_text_of_the_right_size() -> None:
    sessions = [Session("a", 0.0, (Turn(prompt_tokens=30, output_tokens=5),)),
                Session("b", 0.0, (Turn(prompt_tokens=30, output_tokens=5),))]
    b = PromptBuilder(sessions)
    pa, _ = b.prompt(sessions[0].turns[0])
    pb, _ = b.prompt(sessions[1].turns[0])
    assert len(tokens(pa.text)) == 30 and pa.text != pb.text
    assert [m["role"] for m in pa.messages] == ["user"]


def test_shared_trace_blocks_repeat_exactly() -> None:
    # Two requests sharing block 7 (a Mooncake-like layout): the same text for the same block.
    sessions = [Session("a", 0.0, (Turn(20, 4, content=((7, 16), (100, 4), (200, 4))),)),
                Session("b", 0.0, (Turn(20, 4, content=((7, 16), (101, 4), (201, 4))),))]
    b = PromptBuilder(sessions)
    pa, _ = b.prompt(sessions[0].turns[0])
    pb, _ = b.prompt(sessions[1].turns[0])
    assert tokens(pa.text)[:16] == tokens(pb.text)[:16]
    assert tokens(pa.text)[16:] != tokens(pb.text)[16:]


@pytest.mark.parametrize(("start", "stop"), [(0, 5), (3, 12), (5, 6), (9, 20)])
def test_stream_spans_keep_answers_whole(start: int, stop: int) -> None:
    s = StreamText(key=1, seed=0)
    s.fill_to(5)
    s.append_answer(" one two three", 3)  # positions 5..7
    s.fill_to(20)
    runs = s.spans(start, stop)
    text = "".join(t for _, t in runs)
    assert (" one two three" in text) == (start < 8 and stop > 5)
    assert all(t == " one two three" for is_answer, t in runs if is_answer)
