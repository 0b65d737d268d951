"""A local prefill on a decode node: the chunk it may take per step, and what that costs.

AMPD's placement prices a local prefill with this model (:class:`~tokenomy.policy.ampd.placement.
AdaptivePlacement`), and the simulator re-sizes a banked prefill's chunks with the same function
after every step (``sim/deployments/banked_chunks.py``), so the chunk a turn runs in is the one it
was priced in. The question is separate from placement's (local or remote?): how much prefill a
decode batch can carry per step without breaking its streams' TPOT.

Chunk: the largest of ``local_budget_tokens``, its half, its quarter, ... (down to
``min_local_chunk_tokens``) whose step, carrying the running decodes at the prefill's last
(longest) context, fits the ITL bound (``itl_bound_factor`` x the TPOT SLO); with
``size_local_chunks`` off, always ``local_budget_tokens``. With a bank (``bank_s``: the least TPOT
slack the decode node's streams have banked, ``Engine.tpot_bank_s``) the search starts at
``prefill_budget_tokens``, and a chunk also fits when its steps' excess over the TPOT SLO fits the
bank less ``tpot_bank_margin`` TPOT SLOs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenomy.core import SLO
from tokenomy.policy.estimator import Estimator


class ChunkConfig(Protocol):
    """The knobs the chunk reads (``PlacementConfig`` has them; its docstring states each)."""

    @property
    def local_budget_tokens(self) -> int: ...
    @property
    def prefill_budget_tokens(self) -> int: ...
    @property
    def itl_bound_factor(self) -> float: ...
    @property
    def size_local_chunks(self) -> bool: ...
    @property
    def min_local_chunk_tokens(self) -> int: ...
    @property
    def tpot_bank_margin(self) -> float: ...


@dataclass(frozen=True, slots=True)
class LocalChunk:
    """``tokens`` per step; ``elapsed_s`` of the prefill's own steps; ``itl_s`` its longest step
    (the ITL the running decodes suffer); ``slack_s`` what is left of the ITL bound (or of the
    bank), negative when even the smallest chunk does not fit."""

    tokens: int
    elapsed_s: float
    itl_s: float
    slack_s: float


def local_step_s(estimator: Estimator, n: int, context: int, seqs: int, decode_ctx: int) -> float:
    """One decode-node step: a prefill chunk of ``n`` tokens after ``context``, beside ``seqs``
    decodes holding ``decode_ctx`` tokens of context."""
    return estimator.chunk_step_time_s(n, context, seqs, decode_ctx)


def size_local_chunk(estimator: Estimator, cfg: ChunkConfig, slo: SLO, *, todo: int, context: int, seqs: int,
                     decode_ctx: int, bank_s: float | None = None) -> LocalChunk:
    """The chunk for ``todo`` prompt tokens after ``context`` on a decode node running ``seqs``
    decodes of ``decode_ctx`` tokens of context (module docstring).

    Step time grows with the context, so the longest step is the last full one; the steps between
    are priced by the trapezoid of the first and the last (step time is close to linear in the
    context), which keeps a decision O(log budget) whatever the chunk."""
    itl_bound = cfg.itl_bound_factor * slo.tpot_s

    def price(chunk: int) -> tuple[int, float, float]:
        n = min(todo, chunk)
        steps = -(-todo // n)
        first = local_step_s(estimator, n, context, seqs, decode_ctx)
        if steps == 1:
            return steps, first, first
        last_n = todo - (steps - 1) * n
        last = local_step_s(estimator, last_n, context + todo - last_n, seqs, decode_ctx + (steps - 1) * seqs)
        # the last full chunk bounds the ITL (the final one may be shorter)
        peak = local_step_s(estimator, n, context + todo - last_n - n, seqs, decode_ctx + (steps - 2) * seqs)
        return steps, (steps - 1) * (first + peak) / 2 + last, max(first, peak, last)

    chunk = cfg.local_budget_tokens if bank_s is None else max(cfg.local_budget_tokens, cfg.prefill_budget_tokens)
    while True:
        steps, elapsed, itl = price(chunk)
        slack = itl_bound - itl
        if bank_s is not None:  # the bank pays each step's excess over the TPOT SLO
            slack = max(slack, bank_s - cfg.tpot_bank_margin * slo.tpot_s - steps * max(0.0, itl - slo.tpot_s))
        if slack >= 0 or chunk <= cfg.min_local_chunk_tokens or not (cfg.size_local_chunks or bank_s is not None):
            return LocalChunk(min(chunk, todo), elapsed, itl, slack)
        chunk = max(cfg.min_local_chunk_tokens, chunk // 2)
