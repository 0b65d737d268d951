"""Local prefills sized to the decode batch's banked TPOT slack (on in ``ampd``).

With ``PlacementConfig.tpot_bank``, placement may give a local prefill chunks larger than the
ITL bound allows, paid from the TPOT slack the decode instance's streams have banked
(``Engine.tpot_bank_s``: a stream ``k`` tokens past its first, ``e`` seconds after it, may stall
``k * SLO - e`` and still end within its TPOT SLO). The bank is re-read after every step of the
instance and whenever a turn is submitted there, and the prefill's chunk is re-sized for the
tokens it has left (``AdaptivePlacement.local_chunk``, the function placement priced it with):
the chunk grows back as streams bank slack, shrinks as the prefill spends it, and falls to the
ITL-sized chunk when a stream with no bank joins. One prefill per instance spends the bank;
any other local prefill there is sized to the ITL bound, as without the bank.

With ``lengths`` (``AMPDOptions.tpot_bank_forward``, variant ``ampd-forward-bank``) the bank is forward-looking:
each young stream also counts the tokens a low quantile of the finished turns' outputs says it
will still emit (:mod:`tokenomy.engine.tpot_bank`), each at the instance's expected step time: the
longer of its decode-only step now and the mean of its recent steps, those since the first
reading of the bank at least ``ITL_WINDOW_STEPS`` steps ago (64, a labelled default; the bank is
read at every placement there and after every step of a banked prefill). The steps other local
prefills lengthened count, so an instance whose steps run near the TPOT SLO has little forward
slack to lend.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from tokenomy.core import StepShape
from tokenomy.policy.ampd import AdaptivePlacement
from tokenomy.policy.ampd.output_lengths import OutputLengths
from tokenomy.sim.base import SimContext
from tokenomy.sim.instance import SimInstance

ITL_WINDOW_STEPS = 64


class BankedPrefills:
    """The local prefills each decode instance runs in banked chunks, re-sized step by step."""

    def __init__(
        self, ctx: SimContext, decodes: Sequence[SimInstance], placement_of: Callable[[str], AdaptivePlacement | None],
        lengths: OutputLengths | None = None,
    ) -> None:
        self.ctx = ctx
        self.lengths = lengths  # the forward-looking bank's output lengths (None: the streams' own bank)
        self._seen: dict[str, deque[tuple[int, float]]] = {d.instance_id: deque() for d in decodes}  # (steps, busy_s)
        self._placement_of = placement_of  # the placement policy of a decode instance, by id
        self._local: dict[str, dict[str, int]] = {d.instance_id: {} for d in decodes}  # id -> request -> prompt
        self.started = 0  # local prefills that were given a bank

    def bank_s(self, decode: SimInstance, now: float) -> float | None:
        """The bank placement may spend on a new local prefill on ``decode`` (None: another
        prefill there spends it)."""
        if self._local[decode.instance_id]:
            return None
        return self._bank(decode, now)

    def _bank(self, decode: SimInstance, now: float) -> float:
        engine, expected, itl = decode.engine, 0, 0.0
        placement = self._placement_of(decode.instance_id)
        if self.lengths is not None and placement is not None:
            expected = self.lengths.expected_tokens()
            itl = max(self._recent_step_s(decode), placement.estimator.step_time_s(StepShape(
                decode_seqs=engine.num_decoding, decode_context_tokens=engine.decode_context_tokens)))
        return engine.tpot_bank_s(self.ctx.slo.tpot_s, now, expected, itl)

    def _recent_step_s(self, decode: SimInstance) -> float:
        """Mean duration of ``decode``'s steps since the first reading at least ``ITL_WINDOW_STEPS``
        steps ago (or its first reading; 0 before any step between readings)."""
        seen = self._seen[decode.instance_id]
        now = (decode.steps, decode.busy_s)
        if not seen or seen[-1][0] != now[0]:
            seen.append(now)
        while len(seen) > 1 and now[0] - seen[1][0] >= ITL_WINDOW_STEPS:
            seen.popleft()
        steps = now[0] - seen[0][0]
        return (now[1] - seen[0][1]) / steps if steps > 0 else 0.0

    def start(self, decode: SimInstance, request_id: str, prompt_tokens: int) -> None:
        """``request_id`` prefills on ``decode`` (call after submitting it, then :meth:`resize`)."""
        self._local[decode.instance_id][request_id] = prompt_tokens
        decode.every_step = True  # resized after each of its steps while a local prefill runs
        self.started += 1

    def resize(self, decode: SimInstance, now: float) -> None:
        """Re-size the chunks of ``decode``'s local prefills for its streams' bank now."""
        local = self._local[decode.instance_id]
        placement = self._placement_of(decode.instance_id)
        if not local or placement is None:
            return
        engine = decode.engine
        bank: float | None = self._bank(decode, now)
        for rid, prompt in list(local.items()):
            left = engine.set_chunk_cap(rid, 0)
            if left <= 0:  # its prefill is done (or it left): it no longer spends the bank
                del local[rid]
                decode.every_step = bool(local)  # (no local prefill left: steps that finish nothing skip us)
                continue
            chunk = placement.local_chunk(
                left, prompt - left, engine.num_decoding, engine.decode_context_tokens, self.ctx.slo, bank
            )[0]
            engine.set_chunk_cap(rid, chunk)
            bank = None  # the first prefill spends the bank; the rest keep the ITL bound
