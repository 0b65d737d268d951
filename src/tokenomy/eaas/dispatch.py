"""Routed-expert dispatch: send each expert's tokens to a server, gather, combine; fail over.

This is the one data path every EAAS client uses: ``AttentionClient`` (our own MoE block) and
``RemoteExperts`` (a ``transformers`` model's experts module). The caller has already run the gate
and passes, per token, the chosen expert ids and their combine weights; the dispatcher never sees a
gate or a shared expert.

Combine order is the one ``transformers``' eager experts use, so a remote forward sums exactly what
the monolith sums, in the same order: experts in ascending id, each expert's tokens in (top-k slot,
token) order, ``out.index_add_(0, tokens, expert(x[tokens]) * weight)``.

Failover: a group whose server errors, times out or drops its connection is resent to another
replica of the same expert, after masking the server in this client's routing table. Nothing is
restarted and no other group is touched, so the output equals the monolithic forward exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tokenomy.eaas.protocol import FrameError, MsgType, decode, encode_tensor
from tokenomy.eaas.registry import ExpertUnavailable, RoutingTable, ServerEntry
from tokenomy.eaas.transport import PendingReply, TransportError, ZmqTransport


@dataclass
class ClientStats:
    """What the client did: ``local_compute_s`` is wall time in its own tensor work (gate, shared
    expert, mixer, combine); ``failovers`` counts groups resent after a failure; ``failover_wait_s``
    is the wall time from noticing a failure to holding the resent group's reply (the stall a
    failure costs); ``resent_tokens`` counts the token rows sent a second time."""

    requests: int = 0
    failovers: int = 0
    failover_wait_s: float = 0.0
    resent_tokens: int = 0
    local_compute_s: float = 0.0
    failures: list[str] = field(default_factory=list)  # last few failure reasons, for humans


@dataclass
class _Group:
    key: int              # expert id on the wire and in the routing table
    tokens: torch.Tensor  # token indices into the batch
    slots: torch.Tensor   # which of the token's top-k choices this expert is
    server: ServerEntry
    pending: PendingReply | None  # None: the send itself failed; resend on collect


class PendingExperts:
    """Routed-expert requests in flight; ``result()`` gathers and combines them."""

    def __init__(self, dispatcher: ExpertDispatcher, x: torch.Tensor, weights: torch.Tensor, groups: list[_Group]):
        self._d, self._x, self._weights, self._groups = dispatcher, x, weights, groups

    def result(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Add every group's weighted expert output into ``out`` (zeros if None) and return it."""
        d = self._d
        if out is None:
            out = torch.zeros_like(self._x)
        for g in self._groups:
            y = d.collect(g, self._x)
            with d.timed():
                out.index_add_(0, g.tokens, (y * self._weights[g.tokens, g.slots, None]).to(out.dtype))
        return out


class ExpertDispatcher:
    """Sends routed-expert work to expert servers through a ``RoutingTable``.

    ``timeout_s`` bounds one request: a server that neither answers nor drops its connection within
    it is treated as failed. Keep it a small multiple of the expected round trip for fast failover.
    Not thread-safe (one transport per client thread).
    """

    def __init__(self, table: RoutingTable, hidden: int, transport: ZmqTransport | None = None,
                 timeout_s: float = 1.0, connect_timeout_s: float = 2.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.table, self.hidden = table, hidden
        self.transport = transport or ZmqTransport()
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.stats = ClientStats()

    def timed(self) -> ComputeTimer:
        return ComputeTimer(self.stats)

    def submit(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, key_offset: int = 0,
               n_experts: int | None = None) -> PendingExperts:
        """Send every expert group of ``x`` [tokens, hidden] routed by ``expert_ids`` [tokens, top_k];
        returns before any reply. Expert ``e`` travels as key ``key_offset + e`` (one id space for
        all layers of a model); ids ``>= n_experts`` are skipped, as ``transformers`` does."""
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"expected hidden states [tokens, {self.hidden}], got {tuple(x.shape)}")
        if expert_ids.shape != weights.shape or expert_ids.ndim != 2 or expert_ids.shape[0] != x.shape[0]:
            raise ValueError(f"expert ids {tuple(expert_ids.shape)} and weights {tuple(weights.shape)} must both "
                             f"be [tokens={x.shape[0]}, top_k]")
        with self.timed():
            by_slot = expert_ids.T  # (slot, token) order, as the eager experts loop of transformers
            hit = torch.unique(expert_ids).tolist()
            split = [(e, *torch.where(by_slot == e)) for e in hit if n_experts is None or e < n_experts]
        groups = [_Group(key_offset + e, tok, slot, self.table.pick(key_offset + e), None)
                  for e, slot, tok in split]
        by_server: dict[str, list[_Group]] = {}
        for g in groups:
            by_server.setdefault(g.server.server_id, []).append(g)
        for batch in by_server.values():
            for g, pending in zip(batch, self._send_many(batch[0].server, batch, x), strict=True):
                g.pending = pending
        return PendingExperts(self, x, weights, groups)

    def collect(self, g: _Group, x: torch.Tensor) -> torch.Tensor:
        """The group's expert output; on failure mask the server and resend to another replica."""
        tried: set[str] = set()
        failed_at: float | None = None
        while True:
            try:
                if g.pending is None:
                    raise TransportError(f"send to {g.server.server_id} failed")
                y = self._decode_reply(g.pending.result(), g)
                if failed_at is not None:
                    self.stats.failover_wait_s += time.perf_counter() - failed_at
                return y
            except TransportError as exc:
                self._fail(g.server, f"{g.server.server_id}: {exc}")
            if failed_at is None:
                failed_at = time.perf_counter()
            tried.add(g.server.server_id)
            try:
                g.server = self.table.pick(g.key, exclude=frozenset(tried))
            except ExpertUnavailable as exc:
                raise ExpertUnavailable(f"expert {g.key} lost after failures on {sorted(tried)}: {exc}") from None
            self.stats.failovers += 1
            self.stats.resent_tokens += len(g.tokens)
            resend = _Group(g.key, g.tokens, g.slots, g.server, None)
            g.pending = self._send_many(g.server, [resend], x)[0]

    def _send_many(self, server: ServerEntry, groups: list[_Group], x: torch.Tensor) -> list[PendingReply | None]:
        """Send every group to ``server`` in one message; all ``None`` if the send itself failed."""
        t = self.transport
        try:
            t.connect(server.address, self.connect_timeout_s)
            frames = [encode_tensor(MsgType.EXPERT_REQUEST, t.next_request_id(), g.key, x[g.tokens]) for g in groups]
            pendings = t.request_many(server.address, frames, self.timeout_s)
        except TransportError as exc:
            self._fail(server, f"{server.server_id}: {exc}")
            return [None] * len(groups)
        self.stats.requests += len(groups)
        for g in groups:
            self.table.registry.record(server.server_id, g.key, len(g.tokens))
        return list(pendings)

    def _decode_reply(self, data: bytes, g: _Group) -> torch.Tensor:
        try:
            frame = decode(data)
        except FrameError as exc:
            raise TransportError(f"unreadable reply: {exc}") from None
        if frame.msg_type is MsgType.ERROR:
            raise TransportError(f"error reply {frame.info.get('code')}: {frame.info.get('message')}")
        if frame.msg_type is not MsgType.EXPERT_REPLY or frame.tensor is None or frame.expert_id != g.key:
            raise TransportError(f"unexpected reply {frame.msg_type.name} for expert {frame.expert_id}")
        if frame.tensor.shape != (len(g.tokens), self.hidden):
            raise TransportError(f"reply shape {list(frame.tensor.shape)} does not match the request")
        return frame.tensor

    def _fail(self, server: ServerEntry, reason: str) -> None:
        if not self.table.is_masked(server):
            self.table.mask(server)
            self.transport.disconnect(server.address)
        self.stats.failures = (self.stats.failures + [reason])[-10:]

    def close(self) -> None:
        self.transport.close()


class ComputeTimer:
    """Adds the wall time of a `with` block to ``ClientStats.local_compute_s``."""

    def __init__(self, stats: ClientStats) -> None:
        self._stats = stats
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._stats.local_compute_s += time.perf_counter() - self._t0
