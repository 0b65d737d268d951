"""AMPD adaptive placement: run an incremental prefill on a prefill node or on its decode node.

Estimates (all from ``now``; the TTFTs reported add the time the request already waited):

* remote TTFT on prefill instance ``p`` = queue wait (``prefill_queue_delay_s[p]`` when given,
  else ``p``'s pending prompt tokens, ``prefill_backlog_tokens[p]`` when given or the view's
  ``num_waiting_tokens``, drained in full ``prefill_budget_tokens`` steps)
  + transfer from the decode node of the history ``p`` lacks and the decode node holds
  + prefill of the rest of the prompt after what ``p`` then has
  + transfer back of the prompt KV the decode node lacks;
* local chunk: the most prompt tokens a step beside the running decodes may carry within the ITL
  bound (or the streams' banked TPOT slack, with ``tpot_bank``), and the time its steps take
  (:mod:`tokenomy.policy.ampd.local_chunk`);
* local TTFT = the decode node's queued prompt tokens, then this request's uncached tokens in
  such chunks, each step also carrying the running decodes; local ITL = the longest of those
  steps (the ITL the running decodes suffer).

Rule (docs/ampd.md, "Adaptive placement"), with ``itl_slack = itl_bound_factor * slo.tpot_s -
est_itl_local`` and ``ttft_slack = slo.ttft_s - est_ttft_remote`` of the best prefill node:

* no prefill instance: local;
* the decode node lacks free KV blocks for the request's uncached prompt and output now: remote
  (a local prefill would only wait there, stalling behind memory);
* incremental prefill (``history_tokens > 0``): local iff ``itl_slack >= 0`` and
  ``est_ttft_local < est_ttft_remote``, else remote: a late increment goes to the faster side
  (run locally however slow local was, turns that had lost their history recomputed it on a slow
  decode card in small chunks for minutes);
* first turn: remote unless ``itl_slack >= 0`` and every prefill node misses TTFT while local meets
  it (with ``tpot_bank``: also local whenever sooner while every prefill node has tokens queued).

Remote always goes to the prefill node of lowest estimated TTFT (ties by id). The free-KV rule
counts history the decode node holds only in host memory as held: counting it sent turns remote
that then waited for the same decode memory (docs/ampd-results.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenomy.core import SLO, Request
from tokenomy.policy.ampd.local_chunk import size_local_chunk
from tokenomy.policy.estimator import Estimator
from tokenomy.policy.trace import TraceSink, emit, fields_dict
from tokenomy.policy.view import InstanceView


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Knobs of adaptive placement.

    ``local_budget_tokens``: prefill tokens one step of the decode instance may carry beside
    its running decodes (the instance's ``max_num_batched_tokens`` is this plus its
    ``max_num_seqs``; 2048 is vLLM's chunked-prefill default).
    ``prefill_budget_tokens``: tokens per step of prefill instances, used to turn their queued
    tokens into a wait (our choice, 8192).
    ``itl_bound_factor``: the per-step ITL bound as a multiple of the TPOT SLO (1.0: a single
    inflated step may not exceed the TPOT SLO).
    ``link_bytes_per_s``: KV link bandwidth handed to the estimator (None: its default link).
    ``size_local_chunks``: a local prefill's chunk is the largest that keeps the decode step
    within the ITL bound (module docstring), down to ``min_local_chunk_tokens`` (our choice: 16,
    one KV block); off (the default): always ``local_budget_tokens``. It needs a decode engine
    that caps one request's chunk (the simulator's engine does; a live vLLM backend has only
    an instance-wide ``max_num_batched_tokens``, so the gateway keeps it off).
    ``tpot_bank``: a local prefill may take chunks up to ``prefill_budget_tokens`` whose steps
    exceed the ITL bound, as long as the whole prefill's excess over the TPOT SLO stays within
    the decode batch's banked TPOT slack (``decide(..., tpot_bank_s=...)``) less
    ``tpot_bank_margin`` TPOT SLOs (1.0: our choice); with it, a first turn also runs locally
    when that is sooner while every prefill node has prompt tokens queued (docs/ampd.md). Like
    ``size_local_chunks`` it needs a per-request chunk cap, so the gateway keeps it off.
    """

    local_budget_tokens: int = 2048
    prefill_budget_tokens: int = 8192
    itl_bound_factor: float = 1.0
    link_bytes_per_s: float | None = None
    size_local_chunks: bool = False
    min_local_chunk_tokens: int = 16
    tpot_bank: bool = False
    tpot_bank_margin: float = 1.0

    def __post_init__(self) -> None:
        if self.local_budget_tokens < 1 or self.prefill_budget_tokens < 1:
            raise ValueError("local_budget_tokens and prefill_budget_tokens must be >= 1")
        if not 1 <= self.min_local_chunk_tokens <= self.local_budget_tokens:
            raise ValueError(
                f"min_local_chunk_tokens must be in [1, local_budget_tokens={self.local_budget_tokens}], "
                f"got {self.min_local_chunk_tokens}"
            )
        if not self.itl_bound_factor > 0:
            raise ValueError(f"itl_bound_factor must be > 0, got {self.itl_bound_factor}")
        if self.link_bytes_per_s is not None and not self.link_bytes_per_s > 0:
            raise ValueError(f"link_bytes_per_s must be > 0, got {self.link_bytes_per_s}")
        if not self.tpot_bank_margin >= 0:
            raise ValueError(f"tpot_bank_margin must be >= 0, got {self.tpot_bank_margin}")


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """Where one (incremental) prefill runs, and the estimates that decided it.

    ``local`` True: on the bound decode node, ``prefill_instance`` None. TTFTs include the time
    already waited (``now - arrival_s``). ``est_ttft_remote_s`` and ``ttft_slack_s`` are those of
    the best prefill node (``inf`` / ``-inf`` when there is none); ``itl_slack_s`` is the decode
    node's ITL bound minus ``est_itl_local_s``; ``chunk_tokens`` the most prompt tokens a local
    prefill computes per step (the decode engine's per-request cap).
    """

    local: bool
    prefill_instance: str | None
    est_ttft_remote_s: float
    est_ttft_local_s: float
    est_itl_local_s: float
    ttft_slack_s: float
    itl_slack_s: float
    reason: str
    request_id: str = ""
    decode_instance: str = ""
    chunk_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for the decision trace."""
        return fields_dict(self)


class AdaptivePlacement:
    """Decides local versus remote prefill from TTFT and ITL slack (module docstring)."""

    def __init__(
        self,
        config: PlacementConfig,
        estimator: Estimator,
        *,
        trace: TraceSink | None = None,
        prefill_estimator: Estimator | None = None,
    ) -> None:
        self.config = config
        self.estimator = estimator  # the decode instances' (local prefills)
        self.remote = prefill_estimator or estimator  # the prefill instances' (heterogeneous pools)
        self.trace = trace

    def decide(
        self,
        request: Request,
        *,
        decode: InstanceView,
        prefills: Sequence[InstanceView],
        slo: SLO,
        now: float,
        history_cached_tokens_on_decode: int,
        prefill_queue_delay_s: Mapping[str, float] | None = None,
        prefill_backlog_tokens: Mapping[str, int] | None = None,
        link_wait_s: Mapping[str, float] | None = None,
        tpot_bank_s: float | None = None,
    ) -> PlacementDecision:
        """Place the prefill of ``request`` whose decode is bound to ``decode``.

        ``history_cached_tokens_on_decode``: prompt-prefix tokens whose KV the decode node holds
        (the session's retained history). ``prefill_queue_delay_s``: measured queue delays by
        prefill instance id, overriding the estimate from waiting tokens. ``link_wait_s``: by
        prefill instance id, the queueing on the KV links a remote prefill there would use
        (history pull, the KV's way back), added to its TTFT. ``tpot_bank_s``: the least banked TPOT slack of
        the decode node's streams (``Engine.tpot_bank_s``), read with ``config.tpot_bank``.
        """
        decision = self._decide(
            request, decode, prefills, slo, now, history_cached_tokens_on_decode, prefill_queue_delay_s,
            prefill_backlog_tokens, link_wait_s, tpot_bank_s if self.config.tpot_bank else None,
        )
        emit(self.trace, "placement", now, decision)
        return decision

    def _decide(
        self,
        request: Request,
        decode: InstanceView,
        prefills: Sequence[InstanceView],
        slo: SLO,
        now: float,
        history_cached_tokens_on_decode: int,
        prefill_queue_delay_s: Mapping[str, float] | None,
        prefill_backlog_tokens: Mapping[str, int] | None,
        link_wait_s: Mapping[str, float] | None = None,
        bank_s: float | None = None,
    ) -> PlacementDecision:
        if request.prompt_tokens < 1:
            raise ValueError(f"request {request.request_id!r} has no prompt tokens")
        if history_cached_tokens_on_decode < 0:
            raise ValueError(
                f"history_cached_tokens_on_decode must be >= 0, got {history_cached_tokens_on_decode}"
            )
        waited = max(0.0, now - request.arrival_s)
        on_decode = min(history_cached_tokens_on_decode, request.prompt_tokens)
        context = min(on_decode, request.prompt_tokens - 1)
        queue_s = self._drain_s(decode.num_waiting_tokens, self.config.local_budget_tokens)
        chunk, local_s, itl_s, itl_slack = self.local_chunk(
            request.prompt_tokens - context, context, decode.num_decoding, decode.decode_context_tokens,
            slo, bank_s,
        )
        ttft_local = waited + (queue_s + local_s)
        remote = [
            (
                waited
                + self._remote(request, p, on_decode, prefill_queue_delay_s, prefill_backlog_tokens)
                + (link_wait_s.get(p.instance_id, 0.0) if link_wait_s else 0.0),
                p.instance_id,
            )
            for p in prefills
        ]
        if not remote:
            return PlacementDecision(
                True, None, math.inf, ttft_local, itl_s, -math.inf, itl_slack, "no prefill instance",
                request.request_id, decode.instance_id, chunk_tokens=chunk,
            )
        ttft_remote, best = min(remote)
        ttft_slack = slo.ttft_s - ttft_remote

        def place(local: bool, reason: str) -> PlacementDecision:
            return PlacementDecision(
                local, None if local else best, ttft_remote, ttft_local, itl_s, ttft_slack, itl_slack, reason,
                request.request_id, decode.instance_id, chunk_tokens=chunk if local else 0,
            )

        room_blocks = decode.free_blocks - math.ceil(
            (request.prompt_tokens - on_decode + request.max_output_tokens) / max(1, decode.block_size_tokens)
        )
        if room_blocks < 0:
            return place(False, "decode node has no free KV for the prefill now")
        if request.history_tokens > 0:
            if itl_slack < 0:
                return place(False, "decode node has no ITL slack for the prefill")
            if ttft_local < ttft_remote:
                return place(True, "local is faster and within ITL slack")
            return place(False, "remote is at least as fast")
        if itl_slack >= 0 and ttft_slack < 0 and ttft_local <= slo.ttft_s:
            return place(True, "first turn: every prefill node misses TTFT, local meets it")
        backlog = prefill_backlog_tokens or {}
        pool_busy = all(backlog.get(p.instance_id, p.num_waiting_tokens) > 0 for p in prefills)
        if bank_s is not None and pool_busy and itl_slack >= 0 and ttft_local < ttft_remote:
            return place(True, "first turn: local, in chunks the banked TPOT slack allows, is sooner")
        return place(False, "first turn goes remote")

    def _drain_s(self, tokens: int, budget: int, estimator: Estimator | None = None) -> float:
        """Time to compute ``tokens`` queued prompt tokens in full steps of ``budget`` tokens."""
        if tokens <= 0:
            return 0.0
        return tokens / budget * (estimator or self.estimator).prefill_time_s(budget, 0)

    def _transfer_s(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.remote.kv_transfer_time_s(tokens, self.config.link_bytes_per_s)

    def _remote(
        self,
        request: Request,
        p: InstanceView,
        on_decode: int,
        delays: Mapping[str, float] | None,
        backlogs: Mapping[str, int] | None,
    ) -> float:
        prompt = request.prompt_tokens
        history = min(request.history_tokens, prompt)
        cached_p = min(p.cached_prefix_tokens(request.content, prompt), prompt)
        from_decode = max(0, min(on_decode, history) - cached_p)
        # At least the last prompt token is computed: it yields the first output token.
        have = min(max(cached_p, min(on_decode, history)), prompt - 1)
        if delays is not None and p.instance_id in delays:
            wait = delays[p.instance_id]
            if wait < 0:
                raise ValueError(f"prefill_queue_delay_s[{p.instance_id!r}] must be >= 0, got {wait}")
        else:
            queued = backlogs[p.instance_id] if backlogs is not None and p.instance_id in backlogs else None
            if queued is None:
                queued = p.num_waiting_tokens
            wait = self._drain_s(queued, self.config.prefill_budget_tokens, self.remote)
        return (
            wait
            + self._transfer_s(from_decode)
            + self.remote.prefill_time_s(prompt - have, have)
            + self._transfer_s(prompt - on_decode)  # the decode node lacks the rest
        )

    def local_chunk(
        self, todo: int, context: int, seqs: int, decode_ctx: int, slo: SLO, bank_s: float | None = None
    ) -> tuple[int, float, float, float]:
        """(chunk, time of the prefill's own steps, longest step carrying it, ITL slack) for ``todo``
        prompt tokens after ``context`` beside ``seqs`` decodes of ``decode_ctx`` tokens of context
        (:func:`~tokenomy.policy.ampd.local_chunk.size_local_chunk`, with this placement's model)."""
        c = size_local_chunk(self.estimator, self.config, slo, todo=todo, context=context, seqs=seqs,
                             decode_ctx=decode_ctx, bank_s=bank_s)
        return c.tokens, c.elapsed_s, c.itl_s, c.slack_s
