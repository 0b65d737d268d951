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
emulator's built-in tokenizer and in byte-level BPE vocabularies such as Llama 3's or GPT's; so
the target's ``usage.prompt_tokens`` lands close to the workload's count (the bench reports the
difference). Answer positions use the workload's output length as their width, so the workload's
coordinates stay aligned even if the answer re-tokenizes to another count.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

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


class StreamText:
    """The text of one content stream, materialised as far as any prompt has needed it.

    Invariant: ``ends[i]`` is the stream position (workload tokens) after ``pieces[i]``; filler
    pieces are one word (one token), an answer piece spans the answer's workload token count.
    """

    def __init__(self, key: int, seed: int) -> None:
        # Private (negative) keys get their own seed space so they never repeat a workload stream.
        self._rng = np.random.default_rng([seed, int(key < 0), abs(key)])
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
            idx = self._rng.integers(0, len(WORDS), size=min(need, _BATCH))
            start = self.length
            self.pieces.extend(" " + WORDS[i] for i in idx)
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


class PromptBuilder:
    """Builds every turn's prompt from one shared set of streams (one per bench run).

    Chat layout: the first segment is the ``system`` message when the prompt holds another
    stream after it (the workloads put the shared system prompt there; a trace's first block
    otherwise); the rest is split into ``user`` messages (filler: the task, tool results) and
    ``assistant`` messages (earlier answers). ``sessions`` is accepted for symmetry with the
    simulator's inputs; nothing is precomputed from it.
    """

    def __init__(self, sessions: Sequence[Session] = (), seed: int = 0) -> None:
        del sessions
        self._seed = seed
        self._streams: dict[int, StreamText] = {}
        self._private_key = 0  # turns without content: one fresh negative key per turn

    def _stream(self, key: int) -> StreamText:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = StreamText(key, self._seed)
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
        text = "".join(m["content"] for m in messages)
        return Prompt(text=text, messages=tuple(messages)), content

    def record_answer(self, turn: Turn, content: tuple[Segment, ...], answer: str) -> None:
        """Splice ``answer`` into the stream that holds this turn's output, when the workload
        re-sends that output later (the stream is extended exactly up to the prompt's end)."""
        ranges = _ranges(content, turn.prompt_tokens, turn.prompt_tokens + turn.output_tokens)
        if not ranges or not answer:
            return
        key, lo, hi = ranges[0]
        stream = self._stream(key)
        if stream.length == lo:
            stream.append_answer(answer, hi - lo)
