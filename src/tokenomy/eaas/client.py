"""Attention client: gate locally, send each expert's tokens to a server, gather, combine.

Failover: a group whose server errors, times out or drops its connection is resent to another
replica of the same expert, after masking the server in this client's routing table. Nothing is
restarted and no other group is touched, so the output equals the monolithic forward exactly.

Dual-batch overlap (``forward_layers(..., overlap=True)``): the batch is split in two halves; while
one half's expert round trip is in flight, the client computes the other half's local layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenomy.eaas.layers import rms_norm
from tokenomy.eaas.moe import MoEWeights, route, shared_forward
from tokenomy.eaas.protocol import FrameError, MsgType, decode, encode_tensor
from tokenomy.eaas.registry import ExpertUnavailable, RoutingTable, ServerEntry
from tokenomy.eaas.transport import PendingReply, TransportError, ZmqTransport


@dataclass
class ClientStats:
    """What the client did: ``local_compute_s`` is wall time in its own tensor work (gate, shared
    expert, mixer, combine); ``failovers`` counts groups resent after a failure."""

    requests: int = 0
    failovers: int = 0
    local_compute_s: float = 0.0
    failures: list[str] = field(default_factory=list)  # last few failure reasons, for humans


@dataclass
class _Group:
    expert_id: int
    tokens: torch.Tensor  # token indices into the batch
    slots: torch.Tensor   # which of the token's top-k choices this expert is
    server: ServerEntry
    pending: PendingReply | None  # None: the send itself failed; resend on collect


class PendingMoE:
    """An MoE forward whose expert requests are in flight; ``result()`` gathers and combines."""

    def __init__(self, client: AttentionClient, x: torch.Tensor, weights: torch.Tensor, groups: list[_Group]):
        self._client, self._x, self._weights, self._groups = client, x, weights, groups

    def result(self) -> torch.Tensor:
        c = self._client
        with c.timed():
            out = shared_forward(c.weights, self._x)  # local, while the requests are out
        for g in self._groups:
            y = c.collect(g, self._x)
            with c.timed():
                out.index_add_(0, g.tokens, y * self._weights[g.tokens, g.slots].unsqueeze(-1))
        return out


class AttentionClient:
    """Client side of one MoE block. Needs the gate (and shared expert) weights only.

    ``timeout_s`` bounds one request: a server that neither answers nor drops its connection within
    it is treated as failed. Keep it a small multiple of the expected round trip for fast failover.
    """

    def __init__(self, weights: MoEWeights, table: RoutingTable, transport: ZmqTransport | None = None,
                 timeout_s: float = 1.0, connect_timeout_s: float = 2.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.weights, self.table = weights, table
        self.transport = transport or ZmqTransport()
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.stats = ClientStats()

    def timed(self) -> _Timer:
        return _Timer(self.stats)

    def submit(self, x: torch.Tensor) -> PendingMoE:
        """Gate ``x`` [tokens, hidden] and send every expert group; returns before any reply."""
        if x.ndim != 2 or x.shape[1] != self.weights.config.hidden:
            raise ValueError(f"expected hidden states [tokens, {self.weights.config.hidden}], got {tuple(x.shape)}")
        with self.timed():
            r = route(self.weights, x)
            order = torch.unique(r.expert_ids).tolist()
            by_expert = [(e, *(r.expert_ids == e).nonzero(as_tuple=True)) for e in order]
        groups = [_Group(e, tok, slot, self.table.pick(e), None) for e, tok, slot in by_expert]
        by_server: dict[str, list[_Group]] = {}
        for g in groups:
            by_server.setdefault(g.server.server_id, []).append(g)
        for batch in by_server.values():
            for g, pending in zip(batch, self._send_many(batch[0].server, batch, x), strict=True):
                g.pending = pending
        return PendingMoE(self, x, r.weights, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MoE block's output for ``x``; equals ``reference_forward`` for the same weights."""
        return self.submit(x).result()

    def forward_layers(self, x: torch.Tensor, n_layers: int, mixer: Callable[[torch.Tensor], torch.Tensor],
                       overlap: bool) -> torch.Tensor:
        """``n_layers`` of ``h += mixer(norm(h)); h += moe(norm(h))`` (see ``layers.reference_stack``);
        with ``overlap`` the batch runs as two ping-ponged halves."""
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        halves = list(x.chunk(2)) if overlap and x.shape[0] >= 2 else [x]
        pending: list[PendingMoE | None] = [None] * len(halves)
        for i, h in enumerate(halves):
            with self.timed():
                halves[i] = h + mixer(rms_norm(h))
                normed = rms_norm(halves[i])
            pending[i] = self.submit(normed)
        for layer in range(n_layers):
            # Half i's reply is awaited only after the other half's mixer ran: that hides the round trip.
            for i in range(len(halves)):
                p = pending[i]
                assert p is not None
                halves[i] = halves[i] + p.result()
                if layer + 1 < n_layers:
                    with self.timed():
                        halves[i] = halves[i] + mixer(rms_norm(halves[i]))
                        normed = rms_norm(halves[i])
                    pending[i] = self.submit(normed)
        return torch.cat(halves)

    def collect(self, g: _Group, x: torch.Tensor) -> torch.Tensor:
        """The group's expert output; on failure mask the server and resend to another replica."""
        tried: set[str] = set()
        while True:
            try:
                if g.pending is None:
                    raise TransportError(f"send to {g.server.server_id} failed")
                return self._decode_reply(g.pending.result(), g)
            except TransportError as exc:
                self._fail(g.server, f"{g.server.server_id}: {exc}")
            tried.add(g.server.server_id)
            try:
                g.server = self.table.pick(g.expert_id, exclude=frozenset(tried))
            except ExpertUnavailable as exc:
                raise ExpertUnavailable(f"expert {g.expert_id} lost after failures on {sorted(tried)}: {exc}") \
                    from None
            self.stats.failovers += 1
            g.pending = self._send(g.server, g.expert_id, x[g.tokens])

    def _send(self, server: ServerEntry, expert_id: int, h: torch.Tensor) -> PendingReply | None:
        g = _Group(expert_id, torch.arange(h.shape[0]), torch.zeros(0), server, None)
        return self._send_many(server, [g], h)[0]

    def _send_many(self, server: ServerEntry, groups: list[_Group], x: torch.Tensor) -> list[PendingReply | None]:
        """Send every group to ``server`` in one message; all ``None`` if the send itself failed."""
        t = self.transport
        try:
            t.connect(server.address, self.connect_timeout_s)
            frames = [encode_tensor(MsgType.EXPERT_REQUEST, t.next_request_id(), g.expert_id, x[g.tokens])
                      for g in groups]
            pendings = t.request_many(server.address, frames, self.timeout_s)
        except TransportError as exc:
            self._fail(server, f"{server.server_id}: {exc}")
            return [None] * len(groups)
        self.stats.requests += len(groups)
        for g in groups:
            self.table.registry.record(server.server_id, g.expert_id, len(g.tokens))
        return list(pendings)

    def _decode_reply(self, data: bytes, g: _Group) -> torch.Tensor:
        try:
            frame = decode(data)
        except FrameError as exc:
            raise TransportError(f"unreadable reply: {exc}") from None
        if frame.msg_type is MsgType.ERROR:
            raise TransportError(f"error reply {frame.info.get('code')}: {frame.info.get('message')}")
        if frame.msg_type is not MsgType.EXPERT_REPLY or frame.tensor is None or frame.expert_id != g.expert_id:
            raise TransportError(f"unexpected reply {frame.msg_type.name} for expert {frame.expert_id}")
        if frame.tensor.shape != (len(g.tokens), self.weights.config.hidden):
            raise TransportError(f"reply shape {list(frame.tensor.shape)} does not match the request")
        return frame.tensor

    def _fail(self, server: ServerEntry, reason: str) -> None:
        if not self.table.is_masked(server):
            self.table.mask(server)
            self.transport.disconnect(server.address)
        self.stats.failures = (self.stats.failures + [reason])[-10:]

    def close(self) -> None:
        self.transport.close()


class _Timer:
    def __init__(self, stats: ClientStats) -> None:
        self._stats = stats
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._stats.local_compute_s += time.perf_counter() - self._t0
