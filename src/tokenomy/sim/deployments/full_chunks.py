"""Full-step prefills on decode instances: a first turn an idle decode instance took (ninth round).

With ``PlacementConfig.first_turn_on_idle_decode``, placement sends a new session's first turn
to its decode instance when that instance runs nothing and every prefill instance has a queue:
there it prefills in full ``max_num_batched_tokens`` steps, as a prefill instance would. Other
requests may join the instance meanwhile (remote turns whose KV arrives, local turns), and they
must keep their TPOT: whenever the instance's requests change, its chunks are capped so that a
step carrying them fits the TPOT SLO (:func:`~tokenomy.policy.ampd.admission.lender_chunk_tokens`,
the cap a lender of borrowed turns uses), and uncapped again when it runs the first turn alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenomy.policy.ampd.admission import lender_chunk_tokens
from tokenomy.policy.estimator import Estimator
from tokenomy.sim.base import SimContext
from tokenomy.sim.instance import SimInstance


class FullStepPrefills:
    """The first turns each decode instance prefills in full steps, and the chunk cap they need."""

    def __init__(self, ctx: SimContext, decodes: Sequence[SimInstance], perf_of: Callable[[str], Estimator]) -> None:
        self.ctx = ctx
        self._perf_of = perf_of  # the step-time model of a decode instance, by id
        self._full: dict[str, dict[str, int]] = {d.instance_id: {} for d in decodes}  # id -> request -> context
        self.started = 0  # first turns prefilled in full steps on a decode instance

    def start(self, decode: SimInstance, request_id: str, prompt_tokens: int) -> None:
        """``decode`` takes ``request_id``'s prefill in full steps (call before submitting it)."""
        self._full[decode.instance_id][request_id] = prompt_tokens
        self.started += 1

    def finished(self, decode: SimInstance, request_id: str) -> None:
        """A request on ``decode`` finished: it no longer prefills there."""
        self._full[decode.instance_id].pop(request_id, None)
        self.resize(decode)

    def resize(self, decode: SimInstance) -> None:
        """Cap ``decode``'s prefill chunks for the requests it holds now (module docstring)."""
        full = self._full[decode.instance_id]
        engine = decode.engine
        others = engine.num_running + engine.num_waiting - len(full)
        cap = 0
        if full and others > 0:
            cap = lender_chunk_tokens(
                self._perf_of(decode.instance_id), self.ctx.slo, decode_seqs=others,
                decode_context_tokens=engine.decode_context_tokens, prefill_context_tokens=max(full.values()),
                budget_tokens=self.ctx.config.max_num_batched_tokens,
            )
        engine.set_prefill_chunk_cap(cap)
