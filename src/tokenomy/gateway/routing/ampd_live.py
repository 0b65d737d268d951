"""AMPD on live traffic: the simulator's policy objects, fed the gateway's views of its backends.

Every decision comes from the objects ``tokenomy.policy.ampd.build_ampd_policies`` builds from
the ``AMPD_POLICIES`` registry, the same call the simulator makes (``sim/deployments/policies.py``);
this module only gathers views and applies decisions (its waiting rooms, the prefill queue and
the decode admission gate, are in :mod:`tokenomy.gateway.routing.ampd_gates`). :class:`AmpdRouting`
is the route step of ``routing.mode: ampd``: bind and place, wait for the prefill queue, run the
remote prefill, wait at the decode gate, in that order, once per request:

* **binding**: ``SessionBinder.bind`` picks a session's decode backend (``x-session-id``, or the
  body's ``session_id`` / ``metadata.session_id``); later turns return to it while it has room.
* **placement**: ``AdaptivePlacement.decide`` runs each turn's (incremental) prefill locally on the
  bound decode backend (one plain request: its prefix cache holds the session's history) or
  remotely on a prefill backend (the ``kv_transfer_params`` hand-off of :mod:`tokenomy.gateway.routing.prefill`).
  Views are :class:`tokenomy.gateway.routing.backends.Backend` objects: ``/metrics`` scrapes (queue
  lengths, KV usage) plus the gateway's own accounting (prompt tokens in flight, which
  conversation prefixes each backend served); the history a decode backend holds is the context
  the gateway last saw it finish for the conversation.
* **prefill dispatch**: remote prefills wait in a gateway queue per prefill backend;
  ``PrefillDispatch.decide`` releases the next one (look-ahead reorder, with its deferral cap)
  while the prompt tokens released to that backend and not yet started (all released and not
  answered but the oldest) stay under one step.
* **history pulls**: a remote prefill's request carries ``kv_transfer_params.tokenomy_history_tokens``,
  the session history the bound decode backend holds (the gateway's accounting); our emulator's
  prefill side pulls that KV instead of recomputing it, as the simulator's remote prefill ships
  it. Engines without the extension ignore the key and recompute.
* **decode admission**: a turn bound for a decode backend (a local turn, or a remote one whose
  prefill answered) waits in a gateway gate in front of that backend while it is memory-full;
  ``SlackAdmission.decide`` releases the turn of least TTFT slack first, as the simulator's queue
  in front of its decode engine does. The gate reads the backend's free KV (``/metrics``) and, as
  the requests waiting in the engine, the turns it released that have no first token yet; it is
  pumped when one of them gets its first token or leaves, and after every scrape.
* **retention hints**: ``KVRetentionPolicy.decide`` on the expected tool time
  (``ToolLatencyEstimator``, from the gaps between a session's turns) decides to keep a turn's KV
  pinned across its tool call; a KEEP goes to the decode backend as
  ``POST /v1/tokenomy/retain {"request_id", "ttl_s"}`` before its decode request (our emulator's
  extension; a 404 marks the backend as not supporting it, and nothing more is sent there).
  The gateway remembers its pins, as the simulator's KV keeper does: when a session's next turn
  ends, the previous turn's pin is released; and after every turn, ``KVRetentionPolicy.under_pressure``
  on the decode backend's KV usage names the pins to free (``ttl_s: 0`` releases a held pin).

Times are ``time.monotonic()`` seconds; SLOs and estimates are in the engines' modelled seconds
(equal to wall seconds unless the emulators run with ``time_scale`` != 1).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from redis.exceptions import RedisError

from tokenomy.core import SLO, Request, Role
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.routing.ampd_counts import AmpdCounts
from tokenomy.gateway.routing.ampd_gates import DecodeGate, GatedPrefillQueue
from tokenomy.gateway.routing.backends import Backend, BackendPool
from tokenomy.gateway.routing.config import RoutingConfig
from tokenomy.gateway.routing.prefill import PrefillHop
from tokenomy.gateway.routing.route import DecodeRoute, core_request, decode_candidates, role_candidates
from tokenomy.gateway.routing.upstream import Upstream
from tokenomy.gateway.stores.redis_routing import RedisSessionBindings
from tokenomy.policy.ampd import (
    AdmissionTask,
    AmpdPolicies,
    AmpdPolicyConfig,
    DispatchConfig,
    PlacementConfig,
    PrefillTask,
    RetainedKV,
    Retention,
    ToolLatencyConfig,
    build_ampd_policies,
)
from tokenomy.policy.ampd.binding import SessionBinder
from tokenomy.policy.ampd.reorder import ReorderConfig
from tokenomy.policy.router import Router

log = logging.getLogger(__name__)

RETAIN_PATH = "/v1/tokenomy/retain"
"""The emulator's KV retention extension (docs/ampd-live.md)."""

_CALIBRATION_WEIGHT = 0.1  # weight of the latest request in the tokens-per-estimate average
_SESSION_MEMORY = 100_000  # sessions whose last prompt size is remembered (least recent forgotten)
_TRACE_MEMORY = 1000  # latest decisions kept in memory (AmpdLive.decisions; also logged at debug level)


def ampd_policy_config(config: RoutingConfig) -> AmpdPolicyConfig:
    """The policy config of the ``routing.ampd`` section (the simulator's defaults otherwise)."""
    a = config.ampd
    return AmpdPolicyConfig(
        placement=PlacementConfig(local_budget_tokens=a.local_budget_tokens,
                                  prefill_budget_tokens=a.prefill_budget_tokens, itl_bound_factor=a.itl_bound_factor),
        reorder=ReorderConfig() if a.reorder else None,
        dispatch=DispatchConfig(engine_budget_tokens=a.prefill_budget_tokens),
        tool_latency=ToolLatencyConfig(prior_s=a.tool_latency_prior_s),
        admission=a.admission,
    )


@dataclass(slots=True)
class _Pin:
    """A KEEP hint the gateway sent: the turn's KV is (or will be) pinned on ``backend_id``, for
    ``ttl_s`` after the turn ends (``expires_s``, known once it ended)."""

    session_id: str
    backend_id: str
    kv_tokens: int
    tool_s: float  # the tool time expected when the hint was sent
    ttl_s: float
    expected_resume_s: float = float("inf")
    expires_s: float = float("inf")


class AmpdLive:
    """Applies AMPD's decisions to the gateway's backends (module docstring)."""

    def __init__(self, config: RoutingConfig, pool: BackendPool, http: httpx.AsyncClient,
                 policies: AmpdPolicies) -> None:
        self.config = config
        self.pool = pool
        self.http = http
        self.policies = policies
        self.slo = SLO(ttft_s=config.slo.ttft_s, tpot_s=config.slo.tpot_s)
        self.queues: dict[str, GatedPrefillQueue] = {}
        self.gates: dict[str, DecodeGate] = {}
        self.decisions: deque[Mapping[str, Any]] = deque(maxlen=_TRACE_MEMORY)
        self.counts = AmpdCounts()  # every decision, counted (for /metrics)
        self._queued_on: dict[str, GatedPrefillQueue] = {}  # request id -> queue it was released by
        self._no_retain: set[str] = set()  # backends that answered 404 to a retention hint
        self._pins: dict[str, _Pin] = {}  # request id -> the KEEP hint sent for it
        self._tasks: set[asyncio.Task[Any]] = set()  # release posts in flight
        # Engine tokens per estimated token (the parser guesses 4 characters a token), learnt from
        # the prompt sizes backends report, so that estimates and the real history sizes add up.
        self.tokens_per_estimate = 1.0
        # session -> (parser's estimate, backend's count) of its last prompt: a turn's history is
        # then sized exactly and only its new part estimated (a whole-prompt ratio lags on real
        # tokenizers and can size a small increment as none)
        self._last_prompt: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.bindings: RedisSessionBindings | None = None  # a fleet's shared session bindings

    @classmethod
    def build(cls, config: RoutingConfig, pool: BackendPool, http: httpx.AsyncClient) -> AmpdLive:
        """Build the policies exactly as the simulator does: ``build_ampd_policies`` on a PerfModel."""
        from tokenomy.perf import PerfModel

        perf = PerfModel.from_names(config.perf.model, config.perf.gpu, config.perf.tp)
        live = cls.__new__(cls)
        policies = build_ampd_policies(ampd_policy_config(config), perf,
                                       pcie_bytes_per_s=perf.gpu.pcie_bytes_per_s * config.perf.tp,
                                       trace=live._record)
        cls.__init__(live, config, pool, http, policies)
        return live

    def _record(self, event: Mapping[str, Any]) -> None:
        self.decisions.append(event)
        self.counts.add(event)
        log.debug("ampd decision %s", event)

    def _queue(self, backend: Backend) -> GatedPrefillQueue:
        q = self.queues.get(backend.instance_id)
        if q is None:
            q = self.queues[backend.instance_id] = GatedPrefillQueue(self.policies.dispatch, backend.instance_id)
        return q

    async def place(self, req: ParsedRequest, decodes: list[Backend],
                    prefills: list[Backend]) -> tuple[str, list[Backend], str, int]:
        """(decode backend id, prefill backends to try in order (empty: local), reason, history
        tokens the decode backend holds, which a remote prefill pulls instead of recomputing).

        Returns once a remote prefill was released by its queue (the caller must then call
        :meth:`prefill_done`).
        """
        p = self.policies
        now = time.monotonic()
        sid = req.session_id
        if sid:
            p.tool_latency.on_arrival(sid, now)
        prompt = self.prompt_tokens(req)
        request = core_request(req, now, prompt_tokens=prompt)
        if p.binder is not None:
            decode_id = await self._bind(p.binder, request, decodes, now)
        else:
            decode_id = min(decodes, key=lambda b: (b.in_flight, b.instance_id)).instance_id
        decode = self.pool.by_id[decode_id]
        on_decode = decode.cached_prefix_tokens(request.content, request.prompt_tokens)
        request = core_request(req, now, history_tokens=on_decode, prompt_tokens=prompt)
        await self._retention_hint(req, decode, now, prompt)
        if p.placement is None:
            order, reason = sorted(prefills, key=lambda b: b.instance_id), "placement off: remote"
        else:
            backlog = {b.instance_id: self._queue(b).queued_tokens for b in prefills}
            d = p.placement.decide(request, decode=decode, prefills=prefills, slo=self.slo, now=now,
                                   history_cached_tokens_on_decode=on_decode, prefill_backlog_tokens=backlog)
            if d.local:
                return decode_id, [], d.reason, 0
            first = self.pool.by_id[str(d.prefill_instance)]
            order = [first, *sorted((b for b in prefills if b is not first), key=lambda b: b.instance_id)]
            reason = d.reason
        if not order:
            return decode_id, [], "no prefill backend: local", 0
        q = self._queue(order[0])
        cached = min(order[0].cached_prefix_tokens(request.content, request.prompt_tokens), request.prompt_tokens - 1)
        await q.acquire(PrefillTask(req.request_id, now, now + self.slo.ttft_s,
                                    request.prompt_tokens - cached, cached))
        self._queued_on[req.request_id] = q
        return decode_id, order, reason, request.history_tokens

    async def _bind(self, binder: SessionBinder, request: Request, decodes: list[Backend], now: float) -> str:
        """The binder's decision, made fleet-wide when ``bindings`` (a shared store) is set: a
        session bound by another replica keeps that binding; racing first bindings agree on one."""
        sid, shared = request.session_id, self.bindings
        if not sid or shared is None:
            return binder.bind(request, decodes, now).instance_id
        try:
            held = await shared.get(sid)
            if held is not None:
                binder.adopt(sid, held)
            decision = binder.bind(request, decodes, now)
            chosen = decision.instance_id
            if decision.new_binding:
                chosen = await shared.claim(sid, chosen)
            elif decision.rebound:
                chosen = await shared.move(sid, decision.from_instance, chosen)
        except (RedisError, OSError) as e:  # the shared store is away: this replica's binding
            log.warning("session bindings unavailable (%s): binding %s locally", e, sid)
            return binder.bind(request, decodes, now).instance_id
        if chosen not in self.pool.by_id:
            return decision.instance_id
        binder.adopt(sid, chosen)
        return chosen

    async def admit(self, req: ParsedRequest, decode_id: str, *, remote: bool, arrival_s: float) -> None:
        """Wait for the decode admission gate of ``decode_id`` (no gate: return at once).

        ``remote``: the turn's prompt KV was prefilled elsewhere (it computes nothing there);
        ``arrival_s``: when the gateway received it (``time.monotonic()``), its TTFT clock."""
        admission = self.policies.admission
        decode = self.pool.by_id.get(decode_id)
        if admission is None or decode is None:
            return
        prompt = self.prompt_tokens(req)
        on_decode = decode.cached_prefix_tokens(((req.stream_key, prompt),), prompt)
        gate = self.gates.get(decode_id)
        if gate is None:
            gate = self.gates[decode_id] = DecodeGate(admission, decode, self.slo, stale_s=max(10.0, 4 * self.slo.ttft_s))
            decode.on_progress = gate.progress
        cached = min(on_decode, prompt - 1)
        computed = 0 if remote else prompt - cached
        bs = max(1, decode.block_size_tokens)
        blocks = -(-(prompt + (req.max_tokens or 1) - (0 if remote else cached)) // bs)
        await gate.acquire(AdmissionTask(req.request_id, arrival_s, computed, 0 if remote else cached, blocks))

    def prefill_done(self, req: ParsedRequest) -> None:
        q = self._queued_on.pop(req.request_id, None)
        if q is not None:
            q.done(req.request_id)

    def prompt_tokens(self, req: ParsedRequest) -> int:
        """The prompt's size in engine tokens: the backend's count of the session's last prompt
        plus the calibrated estimate of what was added since; else the calibrated estimate."""
        last = self._last_prompt.get(req.session_id) if req.session_id else None
        if last is not None and req.prompt_tokens_estimate >= last[0]:
            return max(1, last[1] + round((req.prompt_tokens_estimate - last[0]) * self.tokens_per_estimate))
        return max(1, round(req.prompt_tokens_estimate * self.tokens_per_estimate))

    def turn_ended(self, req: ParsedRequest, prompt_tokens: int = 0) -> None:
        """The answer is complete: the tool call starts; older pins and pressure are dealt with.
        ``prompt_tokens``: what the backend counted (calibrates :meth:`prompt_tokens`; 0: unknown)."""
        if prompt_tokens > 0 and req.prompt_tokens_estimate > 0:
            ratio = prompt_tokens / req.prompt_tokens_estimate
            self.tokens_per_estimate += _CALIBRATION_WEIGHT * (ratio - self.tokens_per_estimate)
        if not req.session_id:
            return
        if prompt_tokens > 0:
            self._last_prompt[req.session_id] = (req.prompt_tokens_estimate, prompt_tokens)
            self._last_prompt.move_to_end(req.session_id)
            while len(self._last_prompt) > _SESSION_MEMORY:
                self._last_prompt.popitem(last=False)
        now = time.monotonic()
        self.policies.tool_latency.on_turn_end(req.session_id, now)
        # The session's earlier pins: this turn's KV extends them (the simulator unpins them too).
        for rid in [r for r, p in self._pins.items() if p.session_id == req.session_id and r != req.request_id]:
            self._release(rid)
        pin = self._pins.get(req.request_id)
        if pin is not None:
            pin.expected_resume_s, pin.expires_s = now + pin.tool_s, now + pin.ttl_s
        for backend_id in {p.backend_id for p in self._pins.values()}:
            self._relieve(self.pool.by_id[backend_id], now)

    def _relieve(self, backend: Backend, now: float) -> None:
        """Free pins on ``backend`` as ``KVRetentionPolicy.under_pressure`` orders (its KV usage)."""
        for rid in [r for r, p in self._pins.items() if p.expires_s <= now]:
            del self._pins[rid]  # the engine let it go at its TTL
        retention = self.policies.retention
        mine = {p.session_id: rid for rid, p in self._pins.items() if p.backend_id == backend.instance_id}
        if retention is None or not mine:
            return
        pinned = [RetainedKV(p.session_id, p.kv_tokens, p.expected_resume_s) for p in map(self._pins.get, mine.values())
                  if p is not None]
        usage = min(1.0, max(0.0, backend.kv_usage))
        capacity = backend.total_blocks * backend.block_size_tokens
        for d in retention.under_pressure(pinned, kv_usage=usage, capacity_tokens=capacity, now=now):
            self._release(mine[d.session_id])

    def _release(self, request_id: str) -> None:
        pin = self._pins.pop(request_id)
        backend = self.pool.by_id[pin.backend_id]
        task = asyncio.get_running_loop().create_task(self._post_retain(backend, request_id, 0.0))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post_retain(self, backend: Backend, request_id: str, ttl_s: float) -> bool:
        """Send a retention hint (``ttl_s`` 0: release); False when it did not get through."""
        client = self.pool.tls_clients.get(backend.instance_id, self.http)  # an https backend's own trust
        try:
            r = await client.post(backend.url + RETAIN_PATH, json={"request_id": request_id, "ttl_s": ttl_s},
                                  timeout=1.0)
        except httpx.HTTPError as exc:
            log.debug("retention hint to %s failed: %s", backend.instance_id, exc)
            return False
        if r.status_code == 404:
            self._no_retain.add(backend.instance_id)
        return r.status_code == 200

    async def _retention_hint(self, req: ParsedRequest, decode: Backend, now: float, prompt_tokens: int) -> None:
        """Ask ``decode`` to keep this turn's KV across the session's next tool call, when decided."""
        retention = self.policies.retention
        if (retention is None or not self.config.ampd.retention_hints or not req.session_id
                or decode.instance_id in self._no_retain):
            return
        expected = self.policies.tool_latency.estimate(now).expected_s
        kv_tokens = prompt_tokens + (req.max_tokens or 1)
        d = retention.decide(session_id=req.session_id, kv_tokens=kv_tokens,
                             expected_tool_latency_s=expected, kv_usage=decode.kv_usage, now=now)
        if d.action is not Retention.KEEP:
            return  # the engine's own LRU frees it (offload needs a host tier the engine lacks)
        if await self._post_retain(decode, req.request_id, d.ttl_s):
            self._pins[req.request_id] = _Pin(req.session_id, decode.instance_id, kv_tokens, expected, d.ttl_s)


class AmpdRouting:
    """The route step of ``routing.mode: ampd`` (module docstring); ``live`` holds AMPD's state."""

    def __init__(self, live: AmpdLive, upstream: Upstream, router: Router) -> None:
        self.live = live
        self.pool = live.pool
        self.router = router  # picks another decode backend when the bound one cannot be reached
        self.hop = PrefillHop(live.pool, upstream)

    async def route(self, req: ParsedRequest) -> DecodeRoute:
        live = self.live
        decodes = decode_candidates(self.pool, req.model)
        prefills = role_candidates(self.pool, Role.PREFILL, req.model)
        arrival = time.monotonic()
        decode_id, order, reason, history = await live.place(req, decodes, prefills)
        try:
            hop = await self.hop.first_reachable(req, order, history, live.prompt_tokens(req))
        finally:
            live.prefill_done(req)
        if hop is None and order:
            log.warning("request %s: no prefill backend reachable; %s prefills locally", req.request_id, decode_id)
            reason += "; no prefill backend reachable: local"
        params, prefill_id = (None, None) if hop is None else (hop[1], hop[0].instance_id)
        await live.admit(req, decode_id, remote=params is not None, arrival_s=arrival)  # wait while it is full
        return DecodeRoute(self.pool, self.router, decode_id, reason, params, prefill_id, live.turn_ended)
