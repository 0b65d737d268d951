"""The wall-clock driver never asks the engine for a step that overlaps the previous one."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tokenomy.core import Request, StepShape
from tokenomy.emulator.driver import EngineDriver, EngineStopped
from tokenomy.engine import Engine, EngineConfig, StepResult


class TenMsSteps:
    def step_time_s(self, shape: StepShape) -> float:
        return 0.01

    def step_flops(self, shape: StepShape) -> float:
        return 0.0


def test_a_clock_reading_before_the_last_step_end_does_not_stop_the_driver() -> None:
    async def scenario() -> int:
        engine = Engine("e0", EngineConfig(num_gpu_blocks=100, block_size_tokens=16), TenMsSteps())
        driver = EngineDriver(engine)
        frozen_now = 5.0
        driver.model_now = lambda: frozen_now  # type: ignore[method-assign]
        handle = driver.submit(Request("r1", 0.0, 32, 3), arrival_wall=driver._t0 + 4.999 * driver.time_scale)
        # A step that ended just after "now" (the loop's timer woke early), with an idle arrival
        # before its end: the old rule started the next step at min(now, ...), before that end.
        first = engine.step(frozen_now - 0.0095)
        assert first is not None
        driver._last_end = first.end_s
        task = asyncio.create_task(driver.run())
        try:
            while handle.finished is None and not task.done():  # bounded by wait_for below
                await asyncio.wait([asyncio.ensure_future(handle.wait()), task],
                                   return_when=asyncio.FIRST_COMPLETED)
            assert not task.done(), task.exception()  # the driver must still be running
        finally:
            task.cancel()
        return handle.emitted

    emitted = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert emitted == 2  # the first token came from the step taken by hand above


class BrokenEngine:
    """An engine whose third step raises, as a bug in the engine would (a real engine behind it; it
    wraps rather than subclasses, since the engine class is compiled: tokenomy._native)."""

    def __init__(self) -> None:
        self._engine = Engine("e0", EngineConfig(num_gpu_blocks=100, block_size_tokens=16), TenMsSteps())
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self, now: float) -> StepResult | None:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("engine bug")
        return self._engine.step(now)


def test_a_crashed_driver_fails_requests_in_flight_and_refuses_new_ones() -> None:
    async def scenario() -> tuple[int, str]:
        driver = EngineDriver(cast(Engine, BrokenEngine()), time_scale=0.001)
        handle = driver.submit(Request("r1", 0.0, 32, 50))
        task = asyncio.create_task(driver.run())
        try:
            while True:  # bounded: the engine raises at its third step
                await handle.wait()
        except EngineStopped as exc:
            message = str(exc)
        seen = handle.emitted
        with pytest.raises(RuntimeError, match="engine bug"):
            await task
        with pytest.raises(EngineStopped):
            driver.submit(Request("r2", 0.0, 8, 2))
        return seen, message

    seen, message = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert seen == 2 and "stopped" in message  # two steps delivered tokens, then the failure
