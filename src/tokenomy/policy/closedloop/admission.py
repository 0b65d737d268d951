"""Closed-loop admission: which request gets the next slot, which waits, which is refused.

The applier (the simulator's admission gate, the gateway's admission pool) owns a queue and a
count of requests in flight, capped at ``max_in_flight``. Every arriving request goes through
:meth:`arrive`, which refuses it or hands back its queue entry; then, while a slot is free, the
applier asks :meth:`pick` for the next entry to admit. An entry still queued at its
``deadline_s`` is shed through :meth:`shed`. So a request is always deferred (queued) before it
is shed, and every step is one decision with its reason in the trace.

``tier_wfq`` (:class:`TierWFQ`): start-time fair queueing (Goyal et al., SIGCOMM 1996) over
tenants, weighted by tier: each tenant's oldest eligible entry has start tag ``max(V, F[tenant])``;
:meth:`pick` admits the one of least start tag, sets the virtual time ``V`` to it and the tenant's
finish tag ``F[tenant]`` to ``start + 1 / weight``. Tags are charged on admission only, so entries
that were shed or refused cost their tenant nothing later (no starvation by old debt). Within a
tenant, first attempts go before retries (``retries_last``): a request its client sends again
after a refusal has already missed a TTFT SLO of the order of the tier waits (its TTFT counts from
the first attempt, which waited a deadline and then a ``retry-after``), while a first attempt can
still meet it, so a free slot goes where it can still buy an SLO-met request (shedding by
predicted SLO miss, within the tenant's share). A tenant's weight is its tier's, shrunk while
its budget runs low (:class:`~tokenomy.policy.closedloop.tiers.ClosedLoopConfig`); a tenant over its rate limit
or low on budget is paced (its entry is not eligible before ``eligible_s``); a tenant whose budget
left cannot pay for the request is refused. ``fifo`` (:class:`BlindFIFO`) is the tenant-blind
baseline: one first-come-first-served queue and one wait before shedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from tokenomy.policy.closedloop.tiers import ClosedLoopConfig, TierSpec
from tokenomy.policy.trace import TraceSink, emit, fields_dict


class Action(StrEnum):
    QUEUE = "queue"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class TenantView:
    """What admission may know of the tenant behind a request, at the moment of deciding.

    ``tokens_per_s``: its consumption (prompt + output tokens) over the configured window;
    ``budget_left_fraction``: its budget left (None: no budget); ``request_budget_fraction``:
    this request's worst case (prompt + max_tokens) as a share of that budget.
    """

    tenant: str
    tier: str
    tokens_per_s: float = 0.0
    budget_left_fraction: float | None = None
    request_budget_fraction: float = 0.0
    rate_limit_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class ArrivalView:
    """One arriving request. ``retries``: how often its client was refused it before and sent it
    again (the simulated client's count; live, the ``x-stainless-retry-count`` header the OpenAI
    and Anthropic SDKs send; 0 for a first attempt)."""

    request_id: str
    tenant: TenantView
    prompt_tokens: int
    max_tokens: int
    retries: int = 0


@dataclass(frozen=True, slots=True)
class LoadView:
    """Requests admitted and not finished, the cap on them, and entries waiting."""

    in_flight: int
    max_in_flight: int
    queued: int


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What :meth:`AdmissionPolicy.arrive` (or :meth:`shed`) decided for one request.

    For ``queue``: the entry's WFQ ``weight``, when it may be admitted (``eligible_s``), when it
    is shed if still waiting (``deadline_s``), the ``max_tokens`` to send (capped under
    degradation), whether it is held while the cluster is loaded (``hold_under_load``) and whether
    it waits behind its tenant's first attempts, being a retry (``retry_last``).
    """

    request_id: str
    tenant: str
    tier: str
    action: Action
    reason: str
    max_tokens: int = 0
    weight: float = 1.0
    eligible_s: float = 0.0
    deadline_s: float = 0.0
    hold_under_load: bool = False
    retry_last: bool = False

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(frozen=True, slots=True)
class PickDecision:
    """Admit ``queue[index]`` now."""

    index: int
    request_id: str
    tenant: str
    tier: str
    waited_s: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(frozen=True, slots=True)
class QueuedView:
    """One waiting entry as the applier holds it (from its queue decision)."""

    request_id: str
    tenant: str
    tier: str
    arrival_s: float
    weight: float
    eligible_s: float
    deadline_s: float
    hold_under_load: bool = False
    retry_last: bool = False

    @classmethod
    def of(cls, d: GateDecision, arrival_s: float) -> QueuedView:
        return cls(d.request_id, d.tenant, d.tier, arrival_s, d.weight, d.eligible_s, d.deadline_s,
                   d.hold_under_load, d.retry_last)


class AdmissionPolicy(Protocol):
    config: ClosedLoopConfig

    def arrive(self, a: ArrivalView, load: LoadView, now: float) -> GateDecision:
        """Queue or refuse an arriving request."""
        ...

    def pick(self, queue: Sequence[QueuedView], load: LoadView, now: float) -> PickDecision | None:
        """The entry to admit into a free slot now; None when none is eligible."""
        ...

    def shed(self, entry: QueuedView, now: float) -> GateDecision:
        """Refuse an entry whose wait ran out (the applier calls this at ``deadline_s``)."""
        ...


def _shed(trace: TraceSink | None, entry: QueuedView, now: float) -> GateDecision:
    d = GateDecision(entry.request_id, entry.tenant, entry.tier, Action.REFUSE,
                     f"waited {now - entry.arrival_s:.2f} s without a slot: shed at its deadline")
    emit(trace, "closed_loop_admission", now, d)
    return d


def _eligible(queue: Sequence[QueuedView], now: float, loaded: bool) -> list[int]:
    return [i for i, e in enumerate(queue) if e.eligible_s <= now and not (e.hold_under_load and loaded)]


def _picked(trace: TraceSink | None, queue: Sequence[QueuedView], index: int, now: float,
            reason: str) -> PickDecision:
    e = queue[index]
    d = PickDecision(index, e.request_id, e.tenant, e.tier, now - e.arrival_s, reason)
    emit(trace, "closed_loop_admit", now, d)
    return d


class BlindFIFO:
    """Tenant-blind baseline: first come, first served; shed after ``blind_max_defer_s``."""

    def __init__(self, config: ClosedLoopConfig, *, trace: TraceSink | None = None) -> None:
        self.config = config
        self.trace = trace

    def arrive(self, a: ArrivalView, load: LoadView, now: float) -> GateDecision:
        d = GateDecision(a.request_id, a.tenant.tenant, a.tenant.tier, Action.QUEUE, "first come, first served",
                         a.max_tokens, 1.0, now, now + self.config.blind_max_defer_s)
        emit(self.trace, "closed_loop_admission", now, d)
        return d

    def pick(self, queue: Sequence[QueuedView], load: LoadView, now: float) -> PickDecision | None:
        ready = _eligible(queue, now, False)
        if not ready:
            return None
        best = min(ready, key=lambda i: (queue[i].arrival_s, i))
        return _picked(self.trace, queue, best, now, "oldest waiting request")

    def shed(self, entry: QueuedView, now: float) -> GateDecision:
        return _shed(self.trace, entry, now)


class TierWFQ:
    """Weighted fair queueing across tiers, with budget and rate pacing (module docstring)."""

    def __init__(self, config: ClosedLoopConfig, *, trace: TraceSink | None = None) -> None:
        self.config = config
        self.trace = trace
        self.virtual_time = 0.0
        self._finish: dict[str, float] = {}  # tenant -> finish tag of its last queued entry

    def _loaded(self, load: LoadView) -> bool:
        deg = self.config.degrade
        return deg is not None and load.in_flight >= deg.load_fraction * load.max_in_flight

    def arrive(self, a: ArrivalView, load: LoadView, now: float) -> GateDecision:
        t = a.tenant
        tier = self.config.tier(t.tier)
        left = t.budget_left_fraction
        if left is not None and (left <= 0 or left < t.request_budget_fraction):
            return self._refuse(a, tier, now, f"budget exhausted: {max(left, 0):.1%} left, the request may "
                                              f"use {t.request_budget_fraction:.1%}")
        weight, pause_s, why = tier.weight, 0.0, [f"tier {tier.name} (weight {tier.weight:g})"]
        slow_below = self.config.budget_slow_below
        if left is not None and left < slow_below:
            factor = left / slow_below
            weight *= max(factor, 0.05)
            pause_s = self.config.budget_pace_s * (1.0 - factor)
            why.append(f"budget low ({left:.1%} left): slowed, weight x{max(factor, 0.05):.2f}, paced {pause_s:.2f} s")
        limit = t.rate_limit_tokens_per_s
        if limit is not None and t.tokens_per_s > limit:
            over_s = (t.tokens_per_s - limit) * self.config.rate_window_s / limit
            pause_s = max(pause_s, over_s)
            why.append(f"over its rate limit ({t.tokens_per_s:.0f} > {limit:.0f} tokens/s): paced {over_s:.2f} s")
        ref = self.config.cost_ref_tokens
        if ref is not None:  # fair in tokens: a request's share of the tenant's slots grows with its size
            cost = max(a.prompt_tokens + a.max_tokens, 1) / ref
            weight /= cost
            why.append(f"cost {cost:.2f} x {ref} tokens")
        max_tokens, hold = a.max_tokens, False
        deg = self.config.degrade
        if deg is not None and tier.rank >= deg.from_rank and self._loaded(load):
            if deg.max_tokens_cap is not None and max_tokens > deg.max_tokens_cap:
                max_tokens = deg.max_tokens_cap
                why.append(f"degraded under load: max_tokens capped at {max_tokens}")
            if deg.long_prompt_tokens is not None and a.prompt_tokens > deg.long_prompt_tokens:
                hold = True
                why.append(f"degraded under load: prompt of {a.prompt_tokens} tokens held until the load drops")
        last = self.config.retries_last and a.retries > 0
        if last:
            why.append(f"retry {a.retries}: its TTFT is already lost, queued behind its tenant's first attempts")
        eligible = now + pause_s
        d = GateDecision(a.request_id, t.tenant, tier.name, Action.QUEUE, "; ".join(why), max_tokens, weight,
                         eligible, eligible + tier.max_defer_s, hold, last)
        emit(self.trace, "closed_loop_admission", now, d)
        return d

    def _refuse(self, a: ArrivalView, tier: TierSpec, now: float, reason: str) -> GateDecision:
        d = GateDecision(a.request_id, a.tenant.tenant, tier.name, Action.REFUSE, reason, a.max_tokens)
        emit(self.trace, "closed_loop_admission", now, d)
        return d

    def start_tag(self, tenant: str) -> float:
        """The start tag the tenant's next admitted entry gets."""
        return max(self.virtual_time, self._finish.get(tenant, 0.0))

    def pick(self, queue: Sequence[QueuedView], load: LoadView, now: float) -> PickDecision | None:
        tier = self.config.tier
        ready = [i for i in _eligible(queue, now, self._loaded(load))
                 if load.in_flight < tier(queue[i].tier).max_load_fraction * load.max_in_flight]
        if not ready:
            return None
        def order(i: int) -> tuple[bool, float, int]:  # first attempts before retries, then oldest
            return queue[i].retry_last, queue[i].arrival_s, i

        heads: dict[str, int] = {}  # each tenant's next entry
        for i in ready:
            j = heads.get(queue[i].tenant)
            if j is None or order(i) < order(j):
                heads[queue[i].tenant] = i
        best = min(heads.values(), key=lambda i: (self.start_tag(queue[i].tenant), queue[i].arrival_s, i))
        e = queue[best]
        start = self.start_tag(e.tenant)
        self.virtual_time = start
        self._finish[e.tenant] = start + 1.0 / e.weight
        return _picked(self.trace, queue, best, now, f"least start tag {start:.3f} (weighted fair share)")

    def shed(self, entry: QueuedView, now: float) -> GateDecision:
        return _shed(self.trace, entry, now)
