"""How a client reaches expert servers: a small interface and its ZeroMQ implementation.

The interface is request/reply with deferred results: ``request`` sends at once and returns a
``PendingReply``; ``result()`` waits for it. That is all dual-batch overlap needs (send, compute,
then wait) and maps onto one-sided RDMA / NIXL transfers as well as onto sockets.

Failure contract: ``result()`` raises ``TransportTimeout`` when no reply arrives by the deadline and
``PeerLost`` as soon as the connection to the server is known to be gone (ZeroMQ monitor event),
so a client can fail over without waiting for the timeout when a server process dies.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message


class TransportError(Exception):
    """The request did not get a reply from this server; the caller may resend elsewhere."""


class TransportTimeout(TransportError):
    """No reply before the per-request deadline."""


class PeerLost(TransportError):
    """The connection to the server dropped (or never existed)."""


class PendingReply(Protocol):
    def result(self) -> bytes:
        """Block until the reply frame arrives; raise TransportError if it will not."""
        ...


class Transport(Protocol):
    """Client side of the expert data path. Not thread-safe: one transport per client thread."""

    def connect(self, address: str, timeout_s: float) -> None:
        """Open a channel to ``address``; raise PeerLost if it cannot be established in time."""
        ...

    def disconnect(self, address: str) -> None: ...

    def request(self, address: str, frame: bytes, timeout_s: float) -> PendingReply:
        """Send ``frame`` now; the reply must echo the frame's request id."""
        ...

    def request_many(self, address: str, frames: list[bytes], timeout_s: float) -> list[PendingReply]:
        """Send several frames to one server at once; one pending reply per frame, in order."""
        ...

    def close(self) -> None: ...


@dataclass
class _Channel:
    socket: zmq.Socket
    monitor: zmq.Socket
    alive: bool = False


_PEER_DOWN = (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED)


class ZmqTransport:
    """DEALER socket per server over tcp:// or ipc://.

    ``rtt_delay_s`` injects a network round trip: a reply is not handed out before ``send time +
    rtt_delay_s`` (it waits in the caller, not on the wire, so computing while a request is in flight
    hides it, exactly as a real delay would be hidden).
    """

    def __init__(self, rtt_delay_s: float = 0.0, context: zmq.Context | None = None) -> None:
        if rtt_delay_s < 0:
            raise ValueError(f"rtt_delay_s must be >= 0, got {rtt_delay_s}")
        self.rtt_delay_s = rtt_delay_s
        self._ctx = context or zmq.Context.instance()
        self._channels: dict[str, _Channel] = {}
        self._inbox: dict[int, bytes] = {}  # replies that arrived while another one was awaited
        self._ids = itertools.count(1)

    def next_request_id(self) -> int:
        return next(self._ids)

    def connect(self, address: str, timeout_s: float = 5.0) -> None:
        if address in self._channels and self._channels[address].alive:
            return
        self.disconnect(address)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # IMMEDIATE: never queue a request for a peer that is not connected; fail it instead.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        monitor = sock.get_monitor_socket()
        sock.connect(address)
        chan = _Channel(sock, monitor)
        self._channels[address] = chan
        deadline = time.monotonic() + timeout_s
        while not chan.alive:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not monitor.poll(left_ms):
                self.disconnect(address)
                raise PeerLost(f"could not connect to {address} within {timeout_s:.1f}s")
            self._on_monitor(chan)

    def disconnect(self, address: str) -> None:
        chan = self._channels.pop(address, None)
        if chan is not None:
            chan.socket.disable_monitor()
            chan.monitor.close(linger=0)
            chan.socket.close(linger=0)

    def is_alive(self, address: str) -> bool:
        chan = self._channels.get(address)
        if chan is not None:
            while chan.monitor.poll(0):
                self._on_monitor(chan)
        return chan is not None and chan.alive

    def request(self, address: str, frame: bytes, timeout_s: float) -> _ZmqPending:
        return self.request_many(address, [frame], timeout_s)[0]

    def request_many(self, address: str, frames: list[bytes], timeout_s: float) -> list[_ZmqPending]:
        """Send several frames to one server as one bundle message (one send instead of one per
        expert group: per-message cost dominates small groups); each frame gets its own reply."""
        from tokenomy.eaas.protocol import peek_request_id

        chan = self._channels.get(address)
        if chan is None or not self.is_alive(address):
            raise PeerLost(f"no live connection to {address}")
        try:
            chan.socket.send(b"".join(frames), zmq.NOBLOCK)
        except zmq.Again:
            raise PeerLost(f"{address} is not accepting requests") from None
        now = time.monotonic()
        return [_ZmqPending(self, address, peek_request_id(f), now + timeout_s, now + self.rtt_delay_s)
                for f in frames]

    def close(self) -> None:
        for address in list(self._channels):
            self.disconnect(address)

    def _on_monitor(self, chan: _Channel) -> None:
        event = recv_monitor_message(chan.monitor)["event"]
        # Alive only after the ZMTP handshake: before it, IMMEDIATE makes sends fail with EAGAIN.
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            chan.alive = True
        elif event in _PEER_DOWN:
            chan.alive = False

    def _wait(self, address: str, request_id: int, deadline: float) -> bytes:
        from tokenomy.eaas.protocol import FrameError, peek_request_id, split_bundle

        while request_id not in self._inbox:
            chan = self._channels.get(address)
            if chan is None:
                raise PeerLost(f"{address} was disconnected")
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise TransportTimeout(f"no reply from {address} for request {request_id}")
            poller = zmq.Poller()
            poller.register(chan.socket, zmq.POLLIN)
            poller.register(chan.monitor, zmq.POLLIN)
            ready = dict(poller.poll(left_ms))
            if chan.socket in ready:
                # Drain everything that is there: replies for other pending requests wait in the inbox.
                while chan.socket.poll(0):
                    try:
                        replies = split_bundle(chan.socket.recv())
                    except FrameError as exc:
                        raise PeerLost(f"{address} sent an unreadable message: {exc}") from None
                    for data in replies:
                        self._inbox[peek_request_id(data)] = data
            elif chan.monitor in ready:
                self._on_monitor(chan)
                if not chan.alive:
                    raise PeerLost(f"connection to {address} lost")
        return self._inbox.pop(request_id)


@dataclass
class _ZmqPending:
    transport: ZmqTransport
    address: str
    request_id: int
    deadline: float
    ready_at: float

    def result(self) -> bytes:
        data = self.transport._wait(self.address, self.request_id, self.deadline)
        # Injected round trip: what is left of it after the caller's own work since the send.
        left = self.ready_at - time.monotonic()
        if left > 0:
            time.sleep(left)
        return data
