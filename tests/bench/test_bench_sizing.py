"""Prompt sizing in the target's tokens: filler words the target keeps whole, template overheads
taken out of the filler, so the target counts exactly the workload's prompt sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.bench.sizing import AnswerCounter, FileTokenizer, measure_sizing
from tokenomy.bench.text import WORDS, PromptBuilder, PromptSizing

from .factories import agent_sessions

SPLIT = frozenset(WORDS[::3])  # a third of the filler words are two tokens in this vocabulary


class TemplateTokenizer:
    """A Llama-3-like target: BOS on every prompt, some words split in two, and a chat template
    of ``<bos> (<hdr> role <end_hdr> \\n\\n content <eot>)* <hdr> assistant <end_hdr> \\n\\n``."""

    name = "fake-llama"

    def count(self, text: str, bos: bool = True) -> int:
        words = text.split(" ")[1:] if text.startswith(" ") else text.split(" ")
        return int(bos) + sum(2 if w in SPLIT else 1 for w in words if w)

    def count_chat(self, messages: list[dict[str, str]]) -> int | None:
        header = 4  # <hdr> role <end_hdr> \n\n
        return 1 + sum(header + self.count(m["content"], bos=False) + 1 for m in messages) + header


class NoTemplate(TemplateTokenizer):
    def count_chat(self, messages: list[dict[str, str]]) -> int | None:
        return None


ANSWER_WORD = sorted(SPLIT)[0]  # answers re-tokenize to twice the tokens generated


def _run_turns(builder: PromptBuilder, session, counter: TemplateTokenizer | None = None):  # type: ignore[no-untyped-def]
    prompts = []
    for turn in session.turns:
        prompt, content = builder.prompt(turn)
        prompts.append(prompt)
        answer = " " + " ".join([ANSWER_WORD] * turn.output_tokens)
        builder.record_answer(turn, content, answer, counter.count(answer, bos=False) if counter else None)
    return prompts


def test_sizing_finds_the_single_token_words_and_the_templates_overheads() -> None:
    s = measure_sizing(TemplateTokenizer(), "chat")
    assert set(s.words) == set(WORDS) - SPLIT
    assert s.prompt_overhead_tokens == 1 + 4  # BOS and the generation prompt
    assert s.message_overhead_tokens == {"system": 5, "user": 5, "assistant": 5}
    c = measure_sizing(TemplateTokenizer(), "completions")
    assert c.prompt_overhead_tokens == 1 and c.message_overhead_tokens == {}


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_target_counts_exactly_the_workloads_prompt_sizes_turn_after_turn(api: str) -> None:
    tok = TemplateTokenizer()
    sessions = agent_sessions(2, turns=4, sys_tokens=60, new=30, out=8)
    builder = PromptBuilder(sessions, sizing=measure_sizing(tok, api), chat=api == "chat")
    for session in sessions:
        prompts = _run_turns(builder, session, counter=tok)
        for turn, prompt in zip(session.turns, prompts, strict=True):
            sent = tok.count_chat(list(prompt.messages)) if api == "chat" else tok.count(prompt.text)
            assert sent == turn.prompt_tokens
        # Each turn re-sends the previous turn's messages unchanged (the history stays cacheable).
        for before, after in zip(prompts, prompts[1:], strict=False):
            assert after.messages[: len(before.messages)] == before.messages
            assert after.text.startswith(before.text)


def test_without_sizing_the_template_and_split_words_inflate_the_count() -> None:
    """What the bench sent before sizing: this target counts far more than the workload."""
    tok = TemplateTokenizer()
    sessions = agent_sessions(1, turns=3, sys_tokens=60, new=30, out=8)
    prompts = _run_turns(PromptBuilder(sessions), sessions[0])
    sent = sum(tok.count_chat(list(p.messages)) or 0 for p in prompts)
    workload = sum(t.prompt_tokens for t in sessions[0].turns)
    assert sent > 1.15 * workload


def test_without_a_chat_template_only_the_filler_is_sized() -> None:
    s = measure_sizing(NoTemplate(), "chat")
    assert set(s.words) == set(WORDS) - SPLIT and s.message_overhead_tokens == {}
    assert "chat template unknown" in s.source


def test_a_short_message_keeps_one_word_and_passes_the_rest_on() -> None:
    sizing = PromptSizing(words=WORDS, prompt_overhead_tokens=7)
    sessions = agent_sessions(1, turns=1, sys_tokens=3, new=20, out=4)
    prompt, _ = PromptBuilder(sessions, sizing=sizing).prompt(sessions[0].turns[0])
    system, user = prompt.messages
    assert len(system["content"].split()) == 1  # gave 2 of its 3 words
    assert len(user["content"].split()) == 20 - 5  # and the user message the other 5


class Merging(TemplateTokenizer):
    """Every word alone is one token, but neighbours merge pairwise."""

    def count(self, text: str, bos: bool = True) -> int:
        n = len(text.split())
        return int(bos) + (n + 1) // 2


class Splitting(TemplateTokenizer):
    def count(self, text: str, bos: bool = True) -> int:
        return 1 + 2 * super().count(text, bos=False)


def test_tokenizers_that_cannot_be_sized_word_by_word_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="merges across words"):
        measure_sizing(Merging(), "completions")
    with pytest.raises(ValueError, match="filler words are one token"):
        measure_sizing(Splitting(), "completions")


def test_a_tokenizer_file_sizes_completions(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [" ".join(w for w in WORDS if w not in SPLIT)] * 50 + ["a b c d e f g h i j k l m n o p"] * 5
    tok.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
        vocab_size=600, show_progress=False, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    file_tok = FileTokenizer(tmp_path)
    sizing = measure_sizing(file_tok, "completions")
    assert 8 <= len(sizing.words) < len(WORDS)  # the vocabulary splits some filler words
    assert all(file_tok.count(" " + w) == 1 for w in sizing.words)
    sessions = agent_sessions(1, turns=1, sys_tokens=50, new=40, out=4)
    prompt, _ = PromptBuilder(sessions, sizing=sizing, chat=False).prompt(sessions[0].turns[0])
    assert file_tok.count(prompt.text) == sessions[0].turns[0].prompt_tokens
    with pytest.raises(ValueError, match="no such file"):
        FileTokenizer(tmp_path / "missing.json")


class _Resp:
    def __init__(self, status: int, payload: bytes) -> None:
        self.status, self._payload = status, payload

    async def read(self) -> bytes:
        return self._payload


def test_answers_are_counted_through_the_benchs_own_connection() -> None:
    import asyncio
    import json
    from contextlib import asynccontextmanager

    calls: list[tuple[str, dict]] = []

    def opener_answering(status: int, payload: bytes):  # type: ignore[no-untyped-def]
        @asynccontextmanager
        async def opener(url, body, headers):  # type: ignore[no-untyped-def]
            calls.append((url, body))
            yield _Resp(status, payload)
        return opener

    sizing = PromptSizing(tokenize_url="http://t/tokenize")
    counter = AnswerCounter(sizing, "m")
    assert counter.active
    ok = opener_answering(200, json.dumps({"count": 7, "tokens": [1] * 7, "max_model_len": 9}).encode())
    assert asyncio.run(counter.count(ok, " a b", {})) == 7
    assert calls[-1] == ("http://t/tokenize", {"model": "m", "prompt": " a b", "add_special_tokens": False})
    assert asyncio.run(counter.count(opener_answering(404, b"{}"), " a b", {})) is None
    assert asyncio.run(counter.count(opener_answering(200, b"not json"), " a b", {})) is None
    assert not AnswerCounter(PromptSizing(), "m").active
