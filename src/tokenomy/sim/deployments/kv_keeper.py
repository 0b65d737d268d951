"""Applies KV retention decisions across agent tool calls, with a host-memory KV tier.

The decisions come from the policies of :func:`tokenomy.sim.deployments.policies.sim_policies`
(retention, tool-latency estimate, host-tier eviction); this class only carries them out on the
simulated instances (AMPD's decode instances, or every instance of a host-tier baseline):

* KEEP pins the finished turn's blocks on the GPU until the next turn of the session ends or
  the TTL expires (Continuum-style pinning);
* OFFLOAD copies the KV to host memory over PCIe (the instance's PCIe link is busy meanwhile);
  the GPU blocks become ordinary free-cached blocks. If they are evicted before the next turn,
  that turn reloads the copy over PCIe instead of recomputing it (or, when its prefill runs
  remotely, the prefill node receives it from there). Host memory per instance is bounded
  (``AMPDOptions.host_kv_bytes_per_gpu`` x TP); which copies make room is the host-eviction
  policy's choice;
* DROP pins nothing: the blocks stay in the LRU prefix cache like any finished request's.

A KEEP pin whose TTL runs out (the tool is late) is handed back to the policy, which offloads
or drops it. When the binding policy moves a session to another instance and asks for its
history to follow (``BindingDecision.move_history``), :meth:`KVKeeper.move_history` sends what
the old instance holds (GPU prefix cache or host copy) over the new instance's inbound KV link
into the new instance's host tier; the next turn reloads it from there once it has arrived.
The host-tier baselines, whose router moves sessions, get the same by :meth:`KVKeeper.follow`.

Without retention (the baseline), every finished turn behaves like DROP.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.core import Request
from tokenomy.perf import PerfModel
from tokenomy.policy.ampd import (
    AmpdPolicies,
    HostCopyView,
    RetainedKV,
    Retention,
    RetentionDecision,
    history_follows,
)
from tokenomy.sim.base import SimContext
from tokenomy.sim.instance import SimInstance
from tokenomy.sim.link import KVFabric, KVLink


@dataclass(slots=True)
class _Pin:
    instance_id: str
    request_id: str
    kv_tokens: int
    expected_resume_s: float


@dataclass(slots=True)
class _HostCopy:
    instance_id: str
    kv_tokens: int
    expire_s: float
    ready_s: float = 0.0  # when the copy is usable there (a moved copy is still on the network before)


class KVKeeper:
    """Retention and the host KV tier of ``decodes`` (the instances that hold sessions' KV)."""

    def __init__(
        self, ctx: SimContext, decodes: list[SimInstance], policies: AmpdPolicies, fabric: KVFabric | None = None
    ) -> None:
        cfg = ctx.config
        self.ctx = ctx
        self._fabric = fabric
        if policies.retention is None:
            raise ValueError("KVKeeper needs a retention policy")
        self.policy = policies.retention
        self._tools = policies.tool_latency
        self._eviction = policies.host_eviction
        self._binding = policies.config.binding
        self._home: dict[str, str] = {}  # session -> instance that ended its last turn
        # Instances of one pool share a shape; on a mixed inventory the first one's stands for all.
        perf = decodes[0].engine.perf if decodes and isinstance(decodes[0].engine.perf, PerfModel) else ctx.perf
        self._kv_bytes = perf.kv_bytes_per_token
        pcie = perf.gpu.pcie_bytes_per_s * perf.tp  # every TP rank has its own PCIe link
        self._by_id = {d.instance_id: d for d in decodes}
        # PCIe is full duplex: copies to host and reloads from host do not queue behind each other.
        self._to_host = {d.instance_id: KVLink(bytes_per_s=pcie) for d in decodes}
        self._from_host = {d.instance_id: KVLink(bytes_per_s=pcie) for d in decodes}
        self._pins: dict[str, _Pin] = {}
        self._pins_on: dict[str, dict[str, _Pin]] = {d.instance_id: {} for d in decodes}  # by instance, pinned order
        self._host: dict[str, _HostCopy] = {}  # by session
        # By instance, in stored order, as the host-eviction policy reads them (made once per copy:
        # a full tier holds thousands, and the policy reads them at every store that does not fit).
        self._host_on: dict[str, dict[str, HostCopyView]] = {d.instance_id: {} for d in decodes}
        self._host_bytes = {d.instance_id: 0 for d in decodes}
        self._host_capacity_bytes = int(cfg.ampd.host_kv_bytes_per_gpu * perf.tp)
        self.decisions: dict[Retention, int] = {r: 0 for r in Retention}
        self.reloaded_tokens = 0
        self.moved_tokens = 0
        self.host_evictions = 0

    @property
    def fabric(self) -> KVFabric:
        if self._fabric is None:
            raise RuntimeError("this KVKeeper was built without a KV fabric: it cannot move history")
        return self._fabric

    def on_arrival(self, request: Request, now: float) -> None:
        """The session's next turn arrived: its tool call is over (an observation for the estimate)."""
        self._tools.on_arrival(request.session_id, now)

    # ---- host copies -------------------------------------------------------------------------
    def host_tokens(self, request: Request, decode_id: str) -> int:
        copy = self._host.get(request.session_id)
        if copy is None or copy.instance_id != decode_id:
            return 0
        return min(copy.kv_tokens, request.history_tokens)

    def _missing(self, request: Request, decode: SimInstance, now: float) -> tuple[int, int, float]:
        """(host-held history tokens, how many of them the decode GPU lacks, when a reload may start)."""
        host = self.host_tokens(request, decode.instance_id)
        missing = host - decode.engine.cached_prefix_tokens(request.content, request.prompt_tokens)
        return host, missing, max(now, self.history_ready_s(request.session_id))

    def reload(self, request: Request, decode: SimInstance, now: float) -> tuple[float, int]:
        """(time the turn can start locally, prompt tokens preloaded from host) for a local turn."""
        # The host copy stays: it is still a valid prefix, and the next offload only adds to it.
        host, missing, start = self._missing(request, decode, now)
        if missing <= 0:
            return now, 0
        self.reloaded_tokens += missing
        ready = self._from_host[decode.instance_id].transfer(start, missing * self._kv_bytes)
        return ready, host

    def follow(self, request: Request, target: SimInstance, now: float) -> int:
        """A router sent the session's turn to ``target``: if its history is on another instance
        and ``history_follows`` says so, move it there (:meth:`move_history`); tokens sent."""
        home = self._home.get(request.session_id)
        if not history_follows(self._binding, home, target.instance_id) or home not in self._by_id:
            return 0
        self._home[request.session_id] = target.instance_id
        return self.move_history(request, self._by_id[home], target, now)

    def move_estimate_s(self, request: Request, old: SimInstance, new: SimInstance, now: float) -> float:
        """Seconds until the session's history held on ``old`` would be on ``new``'s GPU if
        :meth:`move_history` ran now: over the KV link (its queue included), then reloaded from
        ``new``'s host tier over PCIe (its queue included); nothing changes."""
        nbytes = self._movable_tokens(request, old) * self._kv_bytes
        if nbytes <= 0:
            return 0.0
        there = now + self.fabric.eta_s(old.instance_id, new.instance_id, nbytes, now)
        return self._from_host[new.instance_id].done_s(there, nbytes) - now

    def history_ready_s(self, session_id: str) -> float:
        """When the session's host copy can be read (0 without one; later while a moved copy travels)."""
        copy = self._host.get(session_id)
        return 0.0 if copy is None else copy.ready_s

    def _movable_tokens(self, request: Request, old: SimInstance) -> int:
        """History tokens of the session that ``old`` holds: its host copy there or its GPU prefix cache."""
        history = request.history_tokens
        copy = self._host.get(request.session_id)
        on_host = min(copy.kv_tokens, history) if copy is not None and copy.instance_id == old.instance_id else 0
        on_gpu = old.engine.cached_prefix_tokens(request.content, history) if history > 0 else 0
        return max(on_host, on_gpu)

    def move_history(self, request: Request, old: SimInstance, new: SimInstance, now: float) -> int:
        """Send the session's history that ``old`` holds (GPU prefix cache or host copy) to ``new``'s
        host tier over the KV fabric (``new``'s inbound port); returns the tokens sent. The copy
        is usable when the transfer is through (estimated at the start, set when it arrives); a
        transfer cut by its timeout leaves no copy.

        Applies a binding decision with ``move_history``; the old instance's pin and copy are released.
        """
        sid = request.session_id
        copy = self._host.get(sid)
        tokens = self._movable_tokens(request, old)
        self._unpin(sid)
        if tokens <= 0:
            return 0
        kv_bytes = self._kv_bytes
        nbytes = tokens * kv_bytes
        if nbytes > self._host_capacity_bytes:
            return 0
        expire = copy.expire_s if copy is not None else now
        self._drop_host(sid)
        self._make_room(sid, new.instance_id, nbytes, now)
        fabric = self.fabric
        copy = _HostCopy(new.instance_id, tokens, expire, ready_s=now + fabric.eta_s(old.instance_id, new.instance_id, nbytes, now))
        self._store_host(sid, copy)

        def arrived() -> None:
            copy.ready_s = self.ctx.loop.now

        def cut() -> None:
            if self._host.get(sid) is copy:
                self._drop_host(sid)

        fabric.send(old.instance_id, new.instance_id, nbytes, now, arrived, kind="history_move", on_timeout=cut)
        self._host_bytes[new.instance_id] += nbytes
        self.moved_tokens += tokens
        return tokens

    def _make_room(self, session_id: str, instance_id: str, nbytes: int, now: float) -> None:
        """Evict host copies on ``instance_id`` as the host-eviction policy decides, for ``nbytes`` more."""
        if self._host_bytes[instance_id] + nbytes <= self._host_capacity_bytes and self._eviction.trace is None:
            return  # it fits: the policy would evict nothing (and no trace wants its decision)
        room = self._eviction.decide(session_id, nbytes, copies=self._host_on[instance_id].values(),
                                     capacity_bytes=self._host_capacity_bytes, now=now,
                                     used_bytes=self._host_bytes[instance_id])
        for sid in room.evict:
            self._drop_host(sid)
            self.host_evictions += 1

    # ---- end of a turn: the tool call starts -------------------------------------------------
    def tool_started(self, session_id: str, now: float) -> None:
        """The session's answer is complete: its tool call starts (an observation for the estimate)."""
        self._tools.on_turn_end(session_id, now)

    def on_turn_end(
        self, request: Request, instance: SimInstance, now: float, kv_tokens: int | None = None, *, tool_starts: bool = True
    ) -> None:
        """``instance`` is done with the turn and holds ``kv_tokens`` of its KV (default: prompt and
        answer): decide what to do with them while the tool runs. ``tool_starts`` False: the
        answer is not complete yet (a prefill node's part), so the tool's clock does not start."""
        sid = request.session_id
        self._home[sid] = instance.instance_id
        if tool_starts:
            self.tool_started(sid, now)
        self._unpin(sid)
        engine = instance.engine
        if kv_tokens is None:
            kv_tokens = request.prompt_tokens + request.max_output_tokens
        expected = self._tools.estimate(now).expected_s
        decision = self.policy.decide(
            session_id=sid, kv_tokens=kv_tokens, expected_tool_latency_s=expected, kv_usage=engine.kv_usage, now=now
        )
        if decision.action is Retention.KEEP:
            engine.retain(request.request_id)
            pin = _Pin(instance.instance_id, request.request_id, kv_tokens, now + expected)
            self._pins[sid] = self._pins_on[pin.instance_id][sid] = pin
            self.ctx.loop.at(now + decision.ttl_s, self._expire, sid, request.request_id)
        self._apply(decision, instance, kv_tokens, now)
        self._relieve(instance, now)

    def _apply(self, decision: RetentionDecision, instance: SimInstance, kv_tokens: int, now: float) -> None:
        self.decisions[decision.action] += 1
        if decision.action is not Retention.OFFLOAD:
            return
        kv_bytes = self._kv_bytes
        nbytes = kv_tokens * kv_bytes
        iid = instance.instance_id
        # Blocks already on host from the session's previous offload are not copied again.
        old = self._host.get(decision.session_id)
        stored = old.kv_tokens if old is not None and old.instance_id == iid else 0
        if nbytes > self._host_capacity_bytes:
            return
        ready = old.ready_s if old is not None and old.instance_id == iid else 0.0
        self._drop_host(decision.session_id)
        self._make_room(decision.session_id, iid, nbytes, now)
        self._to_host[iid].transfer(now, max(0, kv_tokens - stored) * kv_bytes)
        self._store_host(decision.session_id, _HostCopy(iid, kv_tokens, now + decision.ttl_s, ready_s=ready))
        self._host_bytes[iid] += nbytes

    def _store_host(self, session_id: str, copy: _HostCopy) -> None:
        self._host[session_id] = copy
        self._host_on[copy.instance_id][session_id] = HostCopyView(session_id, copy.kv_tokens * self._kv_bytes,
                                                                   copy.expire_s)

    def _drop_host(self, session_id: str) -> None:
        copy = self._host.pop(session_id, None)
        if copy is not None:
            del self._host_on[copy.instance_id][session_id]
            self._host_bytes[copy.instance_id] -= copy.kv_tokens * self._kv_bytes

    def _relieve(self, instance: SimInstance, now: float) -> None:
        """Under memory pressure, un-pin sessions on this instance as the policy orders."""
        engine = instance.engine
        if not self.policy.under_pressure_at(engine.kv_usage):
            return
        pinned = [RetainedKV(sid, p.kv_tokens, p.expected_resume_s) for sid, p in self._pins_on[instance.instance_id].items()]
        if not pinned:
            return
        capacity = engine.total_blocks * engine.block_size_tokens
        for decision in self.policy.under_pressure(pinned, kv_usage=engine.kv_usage, capacity_tokens=capacity, now=now):
            pin = self._pins[decision.session_id]
            self._unpin(decision.session_id)
            self._apply(decision, instance, pin.kv_tokens, now)

    def _unpin(self, session_id: str) -> None:
        pin = self._pins.pop(session_id, None)
        if pin is not None:
            del self._pins_on[pin.instance_id][session_id]
            instance = self._by_id[pin.instance_id]
            instance.engine.release(pin.request_id)
            # Freed blocks may unblock a waiting request: an idle engine must be stepped again.
            instance.kick(self.ctx.loop.now)

    def _expire(self, session_id: str, request_id: str) -> None:
        pin = self._pins.get(session_id)
        if pin is not None and pin.request_id == request_id:
            self._unpin(session_id)
            now = self.ctx.loop.now
            decision = self.policy.on_expiry(
                session_id=session_id,
                kv_tokens=pin.kv_tokens,
                expected_tool_latency_s=self._tools.estimate(now).expected_s,
                now=now,
            )
            self._apply(decision, self._by_id[pin.instance_id], pin.kv_tokens, now)

    @property
    def pinned_sessions(self) -> int:
        return len(self._pins)
