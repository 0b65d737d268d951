"""Bad configuration and bad requests fail loudly with clear messages."""

from __future__ import annotations

import pytest
from engine_factory import create_engine

from tokenomy.core import Request
from tokenomy.engine import EngineConfig
from tokenomy.policy.view import InstanceView


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"num_gpu_blocks": 1.5}, "num_gpu_blocks"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
        ({"long_prefill_token_threshold": 10, "enable_chunked_prefill": False}, "chunked"),
    ],
)
def test_bad_config_raises(overrides: dict[str, object], match: str) -> None:
    params: dict[str, object] = {"num_gpu_blocks": 10}
    params.update(overrides)
    with pytest.raises(ValueError, match=match):
        EngineConfig(**params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "kwargs", "match"),
    [
        (Request("x", 0.0, 0, 5), {}, "must be >= 1"),
        (Request("x", 0.0, 10, 5), {"preloaded_tokens": 11}, "preloaded_tokens"),
        (Request("x", 0.0, 10, 5), {"emitted_tokens": 5}, "emitted_tokens"),
        (Request("x", 0.0, 10, 5), {"emitted_tokens": -1}, "emitted_tokens"),
        (Request("x", 0.0, 200, 1), {}, "needs KV for 200 tokens"),
    ],
)
def test_bad_requests_raise(request_: Request, kwargs: dict[str, object], match: str) -> None:
    engine = create_engine(num_gpu_blocks=10)
    with pytest.raises(ValueError, match=match):
        engine.add_request(request_, 0.0, **kwargs)  # type: ignore[arg-type]
    assert not engine.has_unfinished()


def test_prompt_larger_than_budget_without_chunking_raises() -> None:
    engine = create_engine(max_num_batched_tokens=64, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="chunked prefill is off"):
        engine.add_request(Request("x", 0.0, 60, 10), 0.0)


def test_duplicate_request_id_raises() -> None:
    engine = create_engine()
    engine.add_request(Request("x", 0.0, 10, 5), 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.add_request(Request("x", 0.0, 10, 5), 0.0)


def test_stepping_before_the_previous_step_ended_raises() -> None:
    engine = create_engine()
    engine.add_request(Request("x", 0.0, 10, 5), 0.0)
    result = engine.step(0.0)
    assert result is not None
    with pytest.raises(ValueError, match="before the previous step ended"):
        engine.step(result.end_s / 2)


def test_idle_engine_steps_to_none() -> None:
    engine = create_engine()
    assert engine.step(0.0) is None and not engine.has_unfinished()


def test_engine_is_an_instance_view() -> None:
    engine: InstanceView = create_engine()
    members = [
        "instance_id", "role", "num_running", "num_waiting", "num_waiting_tokens", "num_decoding",
        "decode_context_tokens", "kv_usage", "free_blocks", "total_blocks", "block_size_tokens",
    ]  # fmt: skip
    values = {name: getattr(engine, name) for name in members}
    assert values["instance_id"] == "e0" and values["free_blocks"] == values["total_blocks"] == 1000
    assert engine.cached_prefix_tokens(((1, 100),), 100) == 0
