"""A step run every ``period_s`` on the event loop, off the request path, until stopped.

The backends' health checks and the fleet's in-flight exchange both run this way. A bug in a step
is logged and the loop goes on: a dead health or sync loop would leave routing on stale state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, step: Callable[[], Awaitable[object]], period_s: float) -> None:
        self.name = name
        self.step = step
        self.period_s = period_s
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # a bug in one step must not stop the loop
                log.exception("%s", self.name)
            await asyncio.sleep(self.period_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
