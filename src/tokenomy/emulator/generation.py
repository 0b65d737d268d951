"""What the emulator "generates": deterministic output tokens, their text, and the prompt's block keys.

Output rule (documented in docs/emulator.md):

* The tokens are drawn from the tokenizer's palette by a PRNG seeded with the request's ``seed``,
  or, without one, with a hash of the prompt's token ids: the same prompt gives the same answer
  (like greedy decoding), on every instance, so PD and mixed serving return the same text.
* Length: ``max_tokens`` when ``ignore_eos`` is set or the EOS rule is off
  (``eos_mean_tokens == 0``); otherwise ``min(max_tokens, max(min_tokens, L))`` where ``L`` is
  drawn from a geometric distribution with mean ``eos_mean_tokens`` (the "model" samples EOS).
* ``stop`` strings are looked for in the generated text; the first match ends the output there
  (the stop string itself is left out), and the token that completed it is the last one counted.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tokenomy.core import Segment
from tokenomy.emulator.tokenizer import Tokenizer

_MASK = (1 << 62) - 1


def prompt_seed(prompt_ids: list[int]) -> int:
    """Deterministic 62-bit seed of a prompt (ints and int tuples hash the same in every process)."""
    return hash(tuple(prompt_ids)) & _MASK


@dataclass(slots=True)
class OutputPlan:
    """The answer of one request, known before it runs.

    ``token_ids`` are the tokens the engine will emit (``len`` is the engine's output length);
    ``pieces[i]`` is the text token ``i`` contributes (concatenated: ``text``);
    ``finish_reason`` is ``"length"`` or ``"stop"``; ``matched_stop`` the stop string that ended it;
    ``tool_call`` the function the answer calls (the pieces are then its JSON arguments, see
    :mod:`tokenomy.emulator.tool_calls`).
    """

    token_ids: list[int]
    pieces: list[str]
    finish_reason: str
    matched_stop: str | None = None
    tool_call: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def plan_output(
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    eos_mean_tokens: float = 0.0,
    seed: int | None = None,
    stop: tuple[str, ...] = (),
    include_stop_str_in_output: bool = False,
) -> OutputPlan:
    """The deterministic answer (see the module docstring). ``max_tokens >= 1``."""
    rng = random.Random(prompt_seed(prompt_ids) if seed is None else seed)
    n = max_tokens
    reason = "length"
    if not ignore_eos and eos_mean_tokens > 0:
        # Geometric length with the given mean: each token is EOS with probability 1/mean.
        p = min(1.0, 1.0 / eos_mean_tokens)
        u = rng.random()
        length = 1 if p >= 1.0 else 1 + int(math.log1p(-u) / math.log1p(-p))
        length = max(length, min_tokens, 1)
        if length < max_tokens:
            n, reason = length, "stop"
    ids = rng.choices(tokenizer.palette, k=n)
    piece = tokenizer.piece
    pieces = [piece(i) for i in ids]
    matched = None
    if stop:
        pieces, ids, matched = _apply_stop(pieces, ids, stop, min_tokens, include_stop_str_in_output)
        if matched is not None:
            reason = "stop"
    return OutputPlan(ids, pieces, reason, matched)


def _apply_stop(
    pieces: list[str], ids: list[int], stop: tuple[str, ...], min_tokens: int, include: bool
) -> tuple[list[str], list[int], str | None]:
    text = "".join(pieces)
    # Stop strings are not checked in the first min_tokens tokens (as vLLM).
    start = sum(len(p) for p in pieces[:min_tokens])
    best: tuple[int, str] | None = None
    for s in stop:
        if not s:
            continue
        at = text.find(s, start)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, s)
    if best is None:
        return pieces, ids, None
    at, matched = best
    length = len(matched)
    end_char = at + length  # the token containing this char completes the stop string
    keep_chars = end_char if include else at
    out_pieces: list[str] = []
    pos = 0
    for p in pieces:
        if pos >= end_char:
            break
        out_pieces.append(p[: max(0, keep_chars - pos)])
        pos += len(p)
    return out_pieces, ids[: len(out_pieces)], matched


def content_of(token_ids: list[int], block_size: int) -> tuple[Segment, ...]:
    """Engine content for a token sequence: one segment per block, keyed by a chained block hash.

    Full block ``i`` becomes the segment ``(h_i, block_size)`` with ``h_i = hash(h_{i-1}, ids of block
    i)``: like vLLM's block hashes, ``h_i`` pins the whole token prefix, so two sequences share the
    engine's block keys exactly as far as they share full blocks of ids. The partial tail block
    gets its own stream key. Ints hash alike in every process, so P and D instances agree.
    """
    segs: list[Segment] = []
    h = 0
    n = len(token_ids)
    full = n - n % block_size
    for i in range(0, full, block_size):
        h = hash((h, *token_ids[i : i + block_size])) & _MASK
        segs.append((h, block_size))
    if full < n:
        segs.append((hash((h, -1, *token_ids[full:])) & _MASK, n - full))
    return tuple(segs)
