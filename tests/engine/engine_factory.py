"""Factories for engine tests (like vLLM's create_scheduler / create_requests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenomy.core import Request, Segment, StepShape
from tokenomy.engine import Engine, EngineConfig, FinishedRequest, StepResult


@dataclass
class FakePerf:
    """Step time = base + per prefill token; records every shape it priced."""

    base_s: float = 0.01
    per_prefill_token_s: float = 0.0
    shapes: list[StepShape] = field(default_factory=list)

    def step_time_s(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return self.base_s + self.per_prefill_token_s * shape.prefill_tokens

    def step_flops(self, shape: StepShape) -> float:
        return 2.0 * shape.total_tokens


def create_engine(perf: FakePerf | None = None, **overrides: object) -> Engine:
    params: dict[str, object] = {"num_gpu_blocks": 1000, "block_size_tokens": 16}
    params.update(overrides)
    return Engine("e0", EngineConfig(**params), perf or FakePerf())  # type: ignore[arg-type]


def create_requests(
    n: int,
    prompt_tokens: int = 64,
    max_output_tokens: int = 8,
    content: tuple[Segment, ...] | None = None,
    prefix: str = "r",
) -> list[Request]:
    """``n`` requests; each gets its own content stream unless ``content`` is given (shared)."""
    return [
        Request(
            f"{prefix}{i}",
            0.0,
            prompt_tokens,
            max_output_tokens,
            content=content if content is not None else ((10_000 + i, prompt_tokens + max_output_tokens),),
        )
        for i in range(n)
    ]


def run(
    engine: Engine, now: float = 0.0, max_steps: int = 100_000
) -> tuple[dict[str, FinishedRequest], list[StepResult]]:
    """Step until nothing is left; returns finished requests by id (asserting each finishes once)."""
    finished: dict[str, FinishedRequest] = {}
    results: list[StepResult] = []
    for _ in range(max_steps):
        result = engine.step(now)
        if result is None:
            break
        results.append(result)
        for f in result.finished:
            assert f.request_id not in finished, f"{f.request_id} finished twice"
            finished[f.request_id] = f
        now = result.end_s
    return finished, results


def computed_prefill_tokens(results: list[StepResult]) -> int:
    return sum(r.shape.prefill_tokens for r in results)
