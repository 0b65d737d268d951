"""The wall-clock driver never asks the engine for a step that overlaps the previous one."""

from __future__ import annotations

import asyncio

from tokenomy.core import Request, StepShape
from tokenomy.emulator.driver import EngineDriver
from tokenomy.engine import Engine, EngineConfig


class TenMsSteps:
    def step_time_s(self, shape: StepShape) -> float:
        return 0.01

    def step_flops(self, shape: StepShape) -> float:
        return 0.0


def test_a_clock_reading_before_the_last_step_end_does_not_stop_the_driver() -> None:
    async def scenario() -> int:
        driver = EngineDriver(Engine("e0", EngineConfig(num_gpu_blocks=100, block_size_tokens=16), TenMsSteps()))
        frozen_now = 5.0
        driver.model_now = lambda: frozen_now  # type: ignore[method-assign]
        # The previous step ended just after "now" (a timer that woke early), and an idle request
        # arrived before that end: the old rule started the next step at min(now, ...) < last end.
        driver._last_end = frozen_now + 0.0005
        handle = driver.submit(Request("r1", 0.0, 32, 3), arrival_wall=driver._t0 + 4.999 * driver.time_scale)
        task = asyncio.create_task(driver.run())
        try:
            while handle.finished is None:  # bounded by wait_for below
                await handle.wait()
        finally:
            task.cancel()
        assert not task.done() or task.cancelled()
        return handle.emitted

    emitted = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert emitted == 3
