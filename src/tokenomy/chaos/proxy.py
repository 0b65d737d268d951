"""A TCP proxy on loopback that the chaos harness slows down: latency injected on the wire path.

``LatencyProxy`` listens on its own port and relays every connection to ``upstream``; each chunk
read in either direction is written out ``delay_s`` after it arrived (a one-way latency, as
``tc netem delay`` gives: chunks in flight overlap, so throughput is not capped, only delayed).
``delay_s`` may change at any time; a chunk already queued keeps the delay it was read with.
``cut`` closes every open connection (what a peer's death looks like to the other side);
``pause`` holds every byte read until ``resume`` (the harness freezes an engine's output this way
before it reads the engine's counters and kills it, so nothing the counters miss reaches the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class LatencyProxy:
    """Relay ``127.0.0.1:port`` to ``upstream_host:upstream_port``; start it inside the running loop."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = 0.0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def start(self, port: int = 0) -> LatencyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()  # the upstream is down: the client sees a refused (closed) connection
            return
        self._conns.update((client_w, up_w))
        try:
            await asyncio.gather(self._pipe(client_r, up_w), self._pipe(up_r, client_w))
        finally:
            for w in (client_w, up_w):
                self._conns.discard(w)
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``delay_s`` (as it was on arrival) late; at EOF
        or an error the writer is closed so the other direction ends too."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.delay_s, data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
            if writer.can_write_eof():
                with contextlib.suppress(OSError):
                    writer.write_eof()
            writer.close()

    def cut(self) -> None:
        for w in list(self._conns):
            w.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.cut()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None
