"""Applies KV retention decisions on decode engines across agent tool calls.

The decisions come from :class:`~tokenomy.policy.ampd.KVRetentionPolicy`; this class only
carries them out on the simulated instances:

* KEEP pins the finished turn's blocks on the GPU until the next turn of the session ends or
  the TTL expires (Continuum-style pinning);
* OFFLOAD copies the KV to host memory over PCIe (the instance's PCIe link is busy meanwhile);
  the GPU blocks become ordinary free-cached blocks. If they are evicted before the next turn,
  that turn reloads the copy over PCIe instead of recomputing it;
* DROP pins nothing: the blocks stay in the LRU prefix cache like any finished request's.

Without retention (the baseline), every finished turn behaves like DROP.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.core import Request
from tokenomy.policy.ampd import KVRetentionPolicy, RetainedKV, Retention, RetentionDecision
from tokenomy.sim.base import SimContext
from tokenomy.sim.instance import SimInstance
from tokenomy.sim.link import KVLink


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


class KVKeeper:
    def __init__(self, ctx: SimContext, decodes: list[SimInstance]) -> None:
        cfg = ctx.config
        self.ctx = ctx
        pcie = ctx.perf.gpu.pcie_bytes_per_s * cfg.tp
        self.policy = KVRetentionPolicy(cfg.ampd.retention_config, ctx.perf, pcie_bytes_per_s=pcie)
        self._by_id = {d.instance_id: d for d in decodes}
        self._pcie = {d.instance_id: KVLink(bytes_per_s=pcie) for d in decodes}
        self._pins: dict[str, _Pin] = {}
        self._host: dict[str, _HostCopy] = {}
        self._last_end: dict[str, float] = {}
        self._tool_sum_s = 0.0
        self._tool_n = 0
        self.decisions: dict[Retention, int] = {r: 0 for r in Retention}
        self.reloaded_tokens = 0

    # ---- tool-latency estimate ---------------------------------------------------------------
    def on_arrival(self, request: Request, now: float) -> None:
        """Observe the gap since the session's previous answer: the tool call's latency."""
        end = self._last_end.pop(request.session_id, None)
        if end is not None:
            self._tool_sum_s += now - end
            self._tool_n += 1

    def expected_tool_s(self) -> float:
        if self._tool_n == 0:
            return self.ctx.config.ampd.tool_latency_prior_s
        return self._tool_sum_s / self._tool_n

    # ---- host copies -------------------------------------------------------------------------
    def host_tokens(self, request: Request, decode_id: str) -> int:
        copy = self._host.get(request.session_id)
        if copy is None or copy.instance_id != decode_id or copy.expire_s < self.ctx.loop.now:
            return 0
        return min(copy.kv_tokens, request.history_tokens)

    def reload(self, request: Request, decode: SimInstance, now: float) -> tuple[float, int]:
        """(time the turn can start locally, prompt tokens preloaded from host) for a local turn."""
        host = self.host_tokens(request, decode.instance_id)
        self._host.pop(request.session_id, None)
        on_gpu = decode.engine.cached_prefix_tokens(request.content, request.prompt_tokens)
        if host <= on_gpu:
            return now, 0
        missing = host - on_gpu
        self.reloaded_tokens += missing
        ready = self._pcie[decode.instance_id].transfer(now, missing * self.ctx.perf.kv_bytes_per_token)
        return ready, host

    # ---- end of a turn: the tool call starts -------------------------------------------------
    def on_turn_end(self, request: Request, instance: SimInstance, now: float) -> None:
        sid = request.session_id
        self._last_end[sid] = now
        self._unpin(sid)
        engine = instance.engine
        kv_tokens = request.prompt_tokens + request.max_output_tokens
        expected = self.expected_tool_s()
        decision = self.policy.decide(
            session_id=sid, kv_tokens=kv_tokens, expected_tool_latency_s=expected, kv_usage=engine.kv_usage, now=now
        )
        if decision.action is Retention.KEEP:
            engine.retain(request.request_id)
            self._pins[sid] = _Pin(instance.instance_id, request.request_id, kv_tokens, now + expected)
            self.ctx.loop.at(now + decision.ttl_s, self._expire, sid, request.request_id)
        self._apply(decision, instance, kv_tokens, now)
        self._relieve(instance, now)

    def _apply(self, decision: RetentionDecision, instance: SimInstance, kv_tokens: int, now: float) -> None:
        self.decisions[decision.action] += 1
        if decision.action is Retention.OFFLOAD:
            self._pcie[instance.instance_id].transfer(now, kv_tokens * self.ctx.perf.kv_bytes_per_token)
            self._host[decision.session_id] = _HostCopy(instance.instance_id, kv_tokens, now + decision.ttl_s)

    def _relieve(self, instance: SimInstance, now: float) -> None:
        """Under memory pressure, un-pin sessions on this instance as the policy orders."""
        engine = instance.engine
        pinned = [
            RetainedKV(sid, p.kv_tokens, p.expected_resume_s)
            for sid, p in self._pins.items()
            if p.instance_id == instance.instance_id
        ]
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
            instance = self._by_id[pin.instance_id]
            instance.engine.release(pin.request_id)
            # Freed blocks may unblock a waiting request: an idle engine must be stepped again.
            instance.kick(self.ctx.loop.now)

    def _expire(self, session_id: str, request_id: str) -> None:
        pin = self._pins.get(session_id)
        if pin is not None and pin.request_id == request_id:
            self._unpin(session_id)

    @property
    def pinned_sessions(self) -> int:
        return len(self._pins)
