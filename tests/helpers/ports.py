"""Ports for servers a test starts: chosen where the kernel never hands out ports by itself."""

from __future__ import annotations

import random
import socket


def free_port_base(count: int) -> int:
    """A base with ``count`` consecutive ports free on 127.0.0.1 now, below the kernel's ephemeral
    range (32768-60999 here): a port taken from bind(0) and closed again can be handed to the next
    process that asks the kernel for one (a server, or a client connection's local port) before ours
    binds it; ports the kernel never hands out race only with other explicit choices."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free ports")
