"""Attention client of our own MoE block: gate and shared expert locally, routed experts remote.

The routed experts go through ``ExpertDispatcher`` (grouping, one bundle per server, failover); this
class adds what is specific to our block: its gate (``route``) and its shared expert.

Dual-batch overlap (``forward_layers(..., overlap=True)``): the batch is split in two halves; while
one half's expert round trip is in flight, the client computes the other half's local layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tokenomy.eaas.dispatch import ClientStats, ComputeTimer, ExpertDispatcher, PendingExperts
from tokenomy.eaas.layers import rms_norm
from tokenomy.eaas.moe import MoEWeights, route, shared_forward
from tokenomy.eaas.registry import RoutingTable
from tokenomy.eaas.transport import ZmqTransport


class PendingMoE:
    """An MoE forward whose expert requests are in flight; ``result()`` gathers and combines."""

    def __init__(self, client: AttentionClient, x: torch.Tensor, routed: PendingExperts):
        self._client, self._x, self._routed = client, x, routed

    def result(self) -> torch.Tensor:
        c = self._client
        with c.timed():
            out = shared_forward(c.weights, self._x)  # local, while the requests are out
        return self._routed.result(out)


class AttentionClient:
    """Client side of one MoE block. Needs the gate (and shared expert) weights only.

    ``timeout_s`` bounds one request: a server that neither answers nor drops its connection within
    it is treated as failed. Keep it a small multiple of the expected round trip for fast failover.
    """

    def __init__(self, weights: MoEWeights, table: RoutingTable, transport: ZmqTransport | None = None,
                 timeout_s: float = 1.0, connect_timeout_s: float = 2.0) -> None:
        self.weights = weights
        self.dispatcher = ExpertDispatcher(table, weights.config.hidden, transport, timeout_s, connect_timeout_s)

    @property
    def stats(self) -> ClientStats:
        return self.dispatcher.stats

    @property
    def table(self) -> RoutingTable:
        return self.dispatcher.table

    @property
    def transport(self) -> ZmqTransport:
        return self.dispatcher.transport

    def timed(self) -> ComputeTimer:
        return self.dispatcher.timed()

    def submit(self, x: torch.Tensor) -> PendingMoE:
        """Gate ``x`` [tokens, hidden] and send every expert group; returns before any reply."""
        if x.ndim != 2 or x.shape[1] != self.weights.config.hidden:
            raise ValueError(f"expected hidden states [tokens, {self.weights.config.hidden}], got {tuple(x.shape)}")
        with self.timed():
            r = route(self.weights, x)
        return PendingMoE(self, x, self.dispatcher.submit(x, r.expert_ids, r.weights))

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

    def close(self) -> None:
        self.dispatcher.close()
