"""Prompt text the target sees, shaped by the workload's token counts and sharing.

A workload describes a prompt as content segments ``(stream_key, n_tokens)`` (see
:mod:`tokenomy.core.request`). Here each stream becomes text: positions the workload fills with
new input (a user task, a tool result, a trace's hashed block) hold *filler words*, drawn from
:data:`WORDS` by a generator seeded with ``(seed, stream_key)``; positions that hold an earlier
answer hold the target's answer text, verbatim. So

- a stream is byte-identical wherever it is re-sent: the shared system prompt across sessions,
  a session's history across its turns (earlier answers included), a trace's repeated blocks;
- different streams differ from their first word, so nothing is shared by accident.

Every filler word is ``" " + word``, a common lower-case English word, which is one token in the
emulator's built-in tokenizer and in byte-level BPE vocabularies such as Llama 3's or GPT's. With
a :class:`~tokenomy.bench.sizing.PromptSizing` measured on the target, the filler is drawn only
from words that are one token *there*, and the tokens the server adds (BOS, the chat template's
headers) are taken out of the filler: the first filler message gives up the per-prompt overhead,
each filler message its own role's overhead and that of an answer just before it. Every message
of a turn is trimmed the same way when a later turn re-sends it, so histories stay byte-identical
and the target's ``usage.prompt_tokens`` lands on the workload's count (the bench reports the
difference). Answer positions use the workload's output length as their width, so the workload's
coordinates stay aligned even if the answer re-tokenizes to another count.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenomy.core import Segment, Session, Turn

_WORD_TEXT = """the of and to in is that for it as with was on be by this are or from at an not have which but
    all can has more one will were their been also time new some would other into only most first any
    about over may such then them these two our out could when like what so its than many used each
    where just well way very because between those both through after much under while might same
    before three here since great still long against part little own world year work made during
    number people water found state small large point order place case form group system value model
    data cache block answer result query search table method note city river house paper music light
    field plant night power money story study market school family health door window road car train
    book page line word letter voice color green blue red black white north south east west early late
    open close start end high low short strong simple clear easy hard real true free full"""

WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
"""Filler vocabulary: one token each (with a leading space) in common tokenizers."""

_BATCH = 1024

MIN_WORDS = 8
"""Fewest single-token filler words sizing accepts (fewer would make streams repetitive)."""


@dataclass(frozen=True)
class PromptSizing:
    """How to size prompts for one target and API.

    ``words``: filler vocabulary, each ``" " + word`` one token. ``prompt_overhead_tokens``: tokens
    the server adds to every prompt (BOS; for chat, the template's fixed part and generation
    prompt). ``message_overhead_tokens``: chat only, tokens the template adds around one message of
    each role. ``source`` says where the numbers came from (shown in the report). The bench
    counts each answer it re-sends with the same tokenizer: ``tokenize_url`` (the target's
    ``POST /tokenize``) or ``tokenizer_path`` (a ``tokenizer.json``); neither: answers count as
    many tokens as were generated. The default is the built-in assumption: every word one token,
    nothing added.
    """

    words: tuple[str, ...] = WORDS
    prompt_overhead_tokens: int = 0
    message_overhead_tokens: dict[str, int] = field(default_factory=dict)
    source: str = "built-in (one token per filler word, no template tokens)"
    tokenize_url: str | None = None
    tokenizer_path: str | None = None

    def __post_init__(self) -> None:
        if len(self.words) < MIN_WORDS:
            raise ValueError(f"prompt sizing needs >= {MIN_WORDS} filler words, got {len(self.words)}")
        if self.prompt_overhead_tokens < 0 or any(v < 0 for v in self.message_overhead_tokens.values()):
            raise ValueError("template overheads must be >= 0 tokens")

    def message_overhead(self, role: str) -> int:
        return self.message_overhead_tokens.get(role, 0)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "filler_words": len(self.words),
                "prompt_overhead_tokens": self.prompt_overhead_tokens,
                "message_overhead_tokens": dict(self.message_overhead_tokens)}


class StreamText:
    """The text of one content stream, materialised as far as any prompt has needed it.

    Invariant: ``ends[i]`` is the stream position (workload tokens) after ``pieces[i]``; filler
    pieces are one word (one token), an answer piece spans the answer's workload token count.
    """

    def __init__(self, key: int, seed: int, words: tuple[str, ...] = WORDS) -> None:
        # Private (negative) keys get their own seed space so they never repeat a workload stream.
        self._rng = np.random.default_rng([seed, int(key < 0), abs(key)])
        self._words = words
        self.pieces: list[str] = []
        self.ends: list[int] = []
        self.answers: list[int] = []  # indexes of pieces that are answers, ascending

    @property
    def length(self) -> int:
        return self.ends[-1] if self.ends else 0

    def fill_to(self, n_tokens: int) -> None:
        """Extend with filler words until the stream covers ``n_tokens`` positions."""
        need = n_tokens - self.length
        while need > 0:
            idx = self._rng.integers(0, len(self._words), size=min(need, _BATCH))
            start = self.length
            self.pieces.extend(" " + self._words[i] for i in idx)
            self.ends.extend(range(start + 1, start + 1 + len(idx)))
            need -= len(idx)

    def append_answer(self, text: str, n_tokens: int) -> None:
        """Splice the target's answer in at the end, spanning ``n_tokens`` workload positions."""
        if n_tokens < 1:
            raise ValueError(f"an answer spans >= 1 token, got {n_tokens}")
        self.answers.append(len(self.pieces))
        self.pieces.append(text)
        self.ends.append(self.length + n_tokens)

    def spans(self, start: int, stop: int) -> list[tuple[bool, str]]:
        """``(is_answer, text)`` runs covering positions ``[start, stop)``, materialising filler as
        needed. A range that cuts an answer includes the whole answer (answers are atomic)."""
        if stop <= start:
            return []
        self.fill_to(stop)
        lo = bisect.bisect_right(self.ends, start)  # first piece ending after start
        hi = bisect.bisect_left(self.ends, stop) + 1  # one past the piece holding stop - 1
        runs: list[tuple[bool, str]] = []
        a = bisect.bisect_left(self.answers, lo)
        while lo < hi:
            nxt = self.answers[a] if a < len(self.answers) and self.answers[a] < hi else hi
            if nxt > lo:
                runs.append((False, "".join(self.pieces[lo:nxt])))
            if nxt < hi:
                runs.append((True, self.pieces[nxt]))
                a += 1
            lo = nxt + 1
        return runs


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt in both API shapes: ``text`` for /v1/completions, ``messages`` for
    /v1/chat/completions (roles system/user/assistant; tool results are user messages)."""

    text: str
    messages: tuple[dict[str, str], ...]


def _ranges(content: Sequence[Segment], start: int, stop: int) -> list[tuple[int, int, int]]:
    """``(stream_key, from, to)`` stream ranges of content positions ``[start, stop)``."""
    offsets: Counter[int] = Counter()
    out: list[tuple[int, int, int]] = []
    pos = 0
    for key, n in content:
        lo, hi = max(start, pos), min(stop, pos + n)
        if lo < hi:
            base = offsets[key] - pos
            out.append((key, base + lo, base + hi))
        offsets[key] += n
        pos += n
    return out


def _drop_words(filler: str, n: int) -> tuple[str, int]:
    """``filler`` (``" w1 w2 ..."``) without its first ``n`` words, keeping one; and what is still owed."""
    parts = filler.split(" ")  # parts[0] == "": every filler word starts with a space
    drop = min(n, len(parts) - 2)
    if drop <= 0:
        return filler, n
    return " " + " ".join(parts[drop + 1:]), n - drop


class PromptBuilder:
    """Builds every turn's prompt from one shared set of streams (one per bench run).

    Chat layout: the first segment is the ``system`` message when the prompt holds another
    stream after it (the workloads put the shared system prompt there; a trace's first block
    otherwise); the rest is split into ``user`` messages (filler: the task, tool results) and
    ``assistant`` messages (earlier answers). ``sessions`` is accepted for symmetry with the
    simulator's inputs; nothing is precomputed from it. ``sizing`` gives the filler words and the
    server's overhead tokens to take out of the filler (default: built-in, nothing taken out);
    ``chat`` says whether the per-message overheads apply (they are the chat template's).
    """

    def __init__(self, sessions: Sequence[Session] = (), seed: int = 0, sizing: PromptSizing | None = None,
                 chat: bool = True) -> None:
        del sessions
        self._seed = seed
        self._sizing = sizing or PromptSizing()
        self._chat = chat
        self._streams: dict[int, StreamText] = {}
        self._private_key = 0  # turns without content: one fresh negative key per turn
        self._answer_excess: dict[str, int] = {}  # answer text -> its tokens beyond the workload's width

    def _stream(self, key: int) -> StreamText:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = StreamText(key, self._seed, self._sizing.words)
        return stream

    def _content(self, turn: Turn) -> tuple[Segment, ...]:
        if turn.content:
            return turn.content
        self._private_key -= 1
        return ((self._private_key, turn.prompt_tokens + turn.output_tokens),)

    def prompt(self, turn: Turn) -> tuple[Prompt, tuple[Segment, ...]]:
        """The prompt of ``turn`` and the content to pass back to :meth:`record_answer`."""
        content = self._content(turn)
        messages: list[dict[str, str]] = []
        ranges = _ranges(content, 0, turn.prompt_tokens)
        has_system = len({key for key, _, _ in ranges}) > 1
        for i, (key, lo, hi) in enumerate(ranges):
            for is_answer, text in self._stream(key).spans(lo, hi):
                role = "system" if has_system and i == 0 else ("assistant" if is_answer else "user")
                if messages and messages[-1]["role"] == role and role != "assistant":
                    messages[-1]["content"] += text
                else:
                    messages.append({"role": role, "content": text})
        self._take_overhead(messages)
        text = "".join(m["content"] for m in messages)
        return Prompt(text=text, messages=tuple(messages)), content

    def _take_overhead(self, messages: list[dict[str, str]]) -> None:
        """Drop the server's overhead tokens from the filler, in message order: the prompt's own
        first, then each message's; an answer's, and the tokens it re-tokenizes to beyond its
        workload width, go to the next filler message. A filler message keeps at least one word;
        what it cannot give moves on to the next (an answer that re-tokenizes shorter lowers what
        later messages give). Deterministic in the messages before it, so a re-sent history is
        trimmed exactly as it was."""
        sizing = self._sizing
        owed = sizing.prompt_overhead_tokens
        for m in messages:
            if self._chat:
                owed += sizing.message_overhead(m["role"])
            if m["role"] == "assistant":
                owed += self._answer_excess.get(m["content"], 0)
            elif owed > 0:
                m["content"], owed = _drop_words(m["content"], owed)

    def record_answer(self, turn: Turn, content: tuple[Segment, ...], answer: str,
                      answer_tokens: int | None = None) -> None:
        """Splice ``answer`` into the stream that holds this turn's output, when the workload
        re-sends that output later (the stream is extended exactly up to the prompt's end).
        ``answer_tokens``: what the target counts for the answer's text in a prompt (it may
        differ from the tokens it generated); the difference is taken out of later filler."""
        ranges = _ranges(content, turn.prompt_tokens, turn.prompt_tokens + turn.output_tokens)
        if not ranges or not answer:
            return
        key, lo, hi = ranges[0]
        stream = self._stream(key)
        if stream.length == lo:
            stream.append_answer(answer, hi - lo)
            if answer_tokens is not None and answer_tokens != hi - lo:
                self._answer_excess[answer] = answer_tokens - (hi - lo)
