"""The tokenizer and the output rule: what makes prefix caching work across turns."""

from __future__ import annotations

import random

import pytest

from tokenomy.emulator.chat import render
from tokenomy.emulator.generation import content_of, plan_output
from tokenomy.emulator.protocol import ChatMessage
from tokenomy.emulator.tokenizer import WordTokenizer
from tokenomy.engine.block_keys import KeyChain

TOK = WordTokenizer()
ENDINGS = ["Hello", "Hello ", "Hello\n", "x:", "42", "a b c  ", "<|user|>", "caf\u00e9", "tab\t"]


@pytest.mark.parametrize("prompt", ENDINGS)
def test_prompt_plus_answer_is_a_token_prefix_of_the_next_prompt(prompt: str) -> None:
    plan = plan_output(TOK, TOK.encode(prompt), max_tokens=20, ignore_eos=True)
    follow_up = prompt + plan.text + " and then?"
    ids = TOK.encode(follow_up)
    expected = TOK.encode(prompt) + plan.token_ids
    assert ids[: len(expected)] == expected


def test_chat_answer_rerenders_as_a_prefix() -> None:
    msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="What is 2+2?")]
    p1 = TOK.encode(render(msgs))
    plan = plan_output(TOK, p1, max_tokens=9, ignore_eos=True)
    msgs2 = [*msgs, ChatMessage(role="assistant", content=plan.text), ChatMessage(role="tool", content="4")]
    p2 = TOK.encode(render(msgs2))
    assert p2[: len(p1) + 9] == p1 + plan.token_ids


def test_answers_are_deterministic_and_seeded() -> None:
    ids = TOK.encode("same prompt")
    a = plan_output(TOK, ids, max_tokens=30, ignore_eos=True)
    b = plan_output(TOK, ids, max_tokens=30, ignore_eos=True)
    c = plan_output(TOK, ids, max_tokens=30, ignore_eos=True, seed=7)
    assert a.text == b.text and a.text != c.text
    assert len(a.token_ids) == 30 and a.finish_reason == "length"
    assert TOK.encode(a.text) == a.token_ids


def test_eos_rule_respects_min_and_max_tokens() -> None:
    rng = random.Random(1)
    lengths = []
    for _ in range(300):
        ids = [rng.randrange(1000, 2000) for _ in range(5)]
        plan = plan_output(TOK, ids, max_tokens=200, min_tokens=3, eos_mean_tokens=20)
        n = len(plan.token_ids)
        assert 3 <= n <= 200
        assert plan.finish_reason == ("length" if n == 200 else "stop")
        lengths.append(n)
    assert 12 < sum(lengths) / len(lengths) < 30  # geometric with mean 20 (a few capped)


def test_stop_string_cuts_the_text_and_counts_the_completing_token() -> None:
    ids = TOK.encode("stop test")
    full = plan_output(TOK, ids, max_tokens=40, ignore_eos=True)
    word = full.pieces[10]  # " something"
    cut = plan_output(TOK, ids, max_tokens=40, ignore_eos=True, stop=(word,))
    first = full.pieces.index(word)
    assert cut.finish_reason == "stop"
    assert cut.text == "".join(full.pieces[:first])
    assert len(cut.token_ids) == first + 1
    kept = plan_output(TOK, ids, max_tokens=40, ignore_eos=True, stop=(word,), include_stop_str_in_output=True)
    assert kept.text == "".join(full.pieces[: first + 1])


def test_block_keys_are_shared_exactly_as_far_as_full_blocks_of_ids() -> None:
    a = list(range(100, 150))  # 50 ids: 3 full blocks of 16
    b = a[:40] + [7] * 10  # differs inside block 2
    ka, kb = KeyChain(content_of(a, 16), 16), KeyChain(content_of(b, 16), 16)
    ka.ensure(3)
    kb.ensure(3)
    assert ka.keys[:2] == kb.keys[:2] and ka.keys[2] != kb.keys[2]
