"""The cluster's front door in the simulator: a closed-loop admission policy applied to arrivals.

:class:`AdmissionGate` stands between the workload driver and a deployment, as the gateway's
admission pool stands in front of the engines: at most ``max_in_flight`` requests are in the
deployment; the others wait in a queue. What waits, what is admitted next and what is shed is
decided by the policy registered as ``AdmissionOptions.policy`` in
:data:`~tokenomy.policy.closedloop.ADMISSION_POLICIES` (the gateway builds the same one); the gate
only applies it: it keeps the queue, the in-flight count, each tenant's consumption (the
policy's rate and budget views) and timers for paced entries and deadlines. A request keeps its
arrival time, so its wait here is TTFT. A refused or shed request is answered as the gateway
answers it (shed: 503 with ``retry-after: options.retry_after_s``; refused for budget: 429 that
is not to be retried), and its client applies ``options.retry``
(:class:`~tokenomy.policy.closedloop.RetryPolicy`, the rule ``tokenomy bench`` applies to the
gateway's answers): the request comes back after the retry-after, keeping its first arrival (its
TTFT is what the user waited), and is counted as ``retried``; a request refused past its retries
is not a record (it added no tokens): it is counted by reason and tenant as refused, and its
session ends, as a bench session ends on a turn refused for good.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tokenomy.core import Request, RequestRecord, Session
from tokenomy.policy.closedloop import (
    Action,
    ArrivalView,
    ConsumptionMeter,
    LoadView,
    QueuedView,
    TenantView,
    make_admission_policy,
)
from tokenomy.policy.trace import TraceSink
from tokenomy.sim.admission_options import AdmissionOptions
from tokenomy.sim.base import Deployment, DoneCallback
from tokenomy.sim.loop import EventLoop

REFUSED_BUDGET = "admission: tenant budget exhausted"
REFUSED_SHED = "admission: shed after waiting past its deadline"


@dataclass
class _Entry:
    request: Request
    view: QueuedView
    max_tokens: int


class AdmissionGate:
    """Applies an admission policy in front of ``deployment`` (module docstring)."""

    def __init__(self, loop: EventLoop, deployment: Deployment, options: AdmissionOptions,
                 sessions: Sequence[Session], done: DoneCallback, trace: TraceSink | None = None) -> None:
        self.loop = loop
        self.deployment = deployment
        self.options = options
        self.policy = make_admission_policy(options.policy, options.closed_loop, trace)
        self.meter = ConsumptionMeter(options.closed_loop.rate_window_s)
        self._done = done
        self._budget = {s.tenant: s.budget_tokens for s in sessions if s.budget_tokens is not None}
        self._rate_limit = {s.tenant: s.rate_limit_tokens_per_s for s in sessions
                            if s.rate_limit_tokens_per_s is not None}
        self.in_flight = 0
        self.queue: list[_Entry] = []
        self.rejected: Counter[str] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()  # (tenant, tier) -> requests refused or shed
        self.deferred: Counter[tuple[str, str]] = Counter()  # (tenant, tier) -> admitted after waiting
        self.retried: Counter[tuple[str, str]] = Counter()  # (tenant, tier) -> refused attempts sent again
        self._retries: Counter[str] = Counter()  # request id -> its retries so far
        self._backing_off: dict[str, Request] = {}  # refused, to be sent again after its retry-after

    @property
    def max_request_tokens(self) -> int:
        return self.deployment.max_request_tokens

    def _load(self) -> LoadView:
        return LoadView(self.in_flight, self.options.max_in_flight, len(self.queue))

    def _tenant(self, request: Request, now: float) -> TenantView:
        budget = self._budget.get(request.tenant)
        left = share = None
        if budget is not None:
            left = 1.0 - self.meter.total(request.tenant) / budget
            share = (request.prompt_tokens + request.max_output_tokens) / budget
        return TenantView(request.tenant, request.tier, self.meter.tokens_per_s(request.tenant, now), left,
                          share or 0.0, self._rate_limit.get(request.tenant))

    def submit(self, request: Request, now: float) -> bool:
        """Queue or refuse an arriving request (or a retried one); False when refused."""
        arrival = ArrivalView(request.request_id, self._tenant(request, now), request.prompt_tokens,
                              request.max_output_tokens, self._retries[request.request_id])
        d = self.policy.arrive(arrival, self._load(), now)
        if d.action is Action.REFUSE:
            return self._refused(request, REFUSED_BUDGET, "429", None, should_retry=False)
        entry = _Entry(request, QueuedView.of(d, now), d.max_tokens)
        self.queue.append(entry)
        self.loop.at(d.deadline_s, self._expire, entry)
        if d.eligible_s > now:
            self.loop.at(d.eligible_s, self._pump)
        self._pump()
        return True

    def _pump(self) -> None:
        now = self.loop.now
        while self.queue and self.in_flight < self.options.max_in_flight:
            pick = self.policy.pick([e.view for e in self.queue], self._load(), now)
            if pick is None:
                return
            entry = self.queue.pop(pick.index)
            self.in_flight += 1
            request = entry.request
            if entry.view.arrival_s < now:  # admitted after waiting (the gateway counts the same)
                self.deferred[(request.tenant, request.tier)] += 1
            if entry.max_tokens < request.max_output_tokens:
                request = dataclasses.replace(request, max_output_tokens=entry.max_tokens)
            self.deployment.submit(request, now)

    def _expire(self, entry: _Entry) -> None:
        for i, e in enumerate(self.queue):
            if e is entry:
                del self.queue[i]
                self.policy.shed(entry.view, self.loop.now)
                self._refused(entry.request, REFUSED_SHED, "503", self.options.retry_after_s)
                return

    def _refused(self, request: Request, reason: str, status: str, retry_after_s: float | None, *,
                 should_retry: bool | None = None) -> bool:
        """The client's answer to a refusal: send it again after the delay its retry rule gives,
        or give up (the request is refused for good, its session ends). Always False."""
        key = (request.tenant, request.tier)
        done = self._retries[request.request_id]
        delay = self.options.retry.delay_s(done, status, retry_after_s, should_retry)
        if delay is None:
            self._retries.pop(request.request_id, None)
            self.rejected[reason] += 1
            self.refused[key] += 1
        else:
            self._retries[request.request_id] = done + 1
            self.retried[key] += 1
            self._backing_off[request.request_id] = request
            self.loop.at(self.loop.now + delay, self._retry, request)
        return False

    def _retry(self, request: Request) -> None:
        del self._backing_off[request.request_id]
        self.submit(request, self.loop.now)

    def on_done(self, request: Request, record: RequestRecord) -> None:
        """A deployment finished ``request``: free its slot, charge its tenant, admit the next."""
        self.in_flight -= 1
        self.meter.add(request.tenant, record.prompt_tokens + record.output_tokens, self.loop.now)
        self._done(request, record)
        self._pump()

    def unfinished(self) -> list[Request]:
        """Requests still waiting here (queued or backing off before a retry) or running in the
        deployment (the horizon cut-off)."""
        return [e.request for e in self.queue] + list(self._backing_off.values()) + self.deployment.unfinished()
