"""Hand-built views and a linear estimator for policy tests."""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.core import Request, Role, Segment, StepShape

KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B in bf16: 32 layers * 8 KV heads * 128 dims * 2 (K, V) * 2 bytes


@dataclass
class FakeView:
    """An InstanceView whose every reading is set by hand; ``cached_tokens`` is its prefix-cache hit."""

    instance_id: str
    role: Role = Role.DECODE
    num_running: int = 0
    num_waiting: int = 0
    num_waiting_tokens: int = 0
    num_decoding: int = 0
    decode_context_tokens: int = 0
    kv_usage: float = 0.0
    free_blocks: int = 1000
    total_blocks: int = 1000
    block_size_tokens: int = 16
    cached_tokens: int = 0

    def cached_prefix_tokens(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        return min(self.cached_tokens, prompt_tokens)


@dataclass
class LinearEstimator:
    """Costs linear in tokens: easy to compute by hand in assertions."""

    prefill_s_per_token: float = 1e-4
    step_base_s: float = 0.01
    decode_s_per_seq: float = 1e-4
    link_bytes_per_s: float = 25e9
    kv_bytes: int = KV_BYTES_PER_TOKEN

    def prefill_time_s(self, n_new_tokens: int, n_cached_tokens: int = 0) -> float:
        return self.prefill_s_per_token * n_new_tokens

    def decode_step_time_s(self, batch_size: int, mean_context_tokens: float) -> float:
        return self.step_base_s + self.decode_s_per_seq * batch_size

    def step_time_s(self, shape: StepShape) -> float:
        return (
            self.step_base_s
            + self.prefill_s_per_token * shape.prefill_tokens
            + self.decode_s_per_seq * shape.decode_seqs
        )

    def chunk_step_time_s(self, n_new_tokens: int, n_context_tokens: int, decode_seqs: int,
                          decode_context_tokens: int) -> float:
        return self.step_time_s(StepShape(prefill_tokens=n_new_tokens, prefill_seqs=1, decode_seqs=decode_seqs))

    def kv_transfer_time_s(self, n_tokens: int, link_bytes_per_s: float | None = None) -> float:
        return n_tokens * self.kv_bytes / (link_bytes_per_s or self.link_bytes_per_s)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes


def make_request(
    prompt_tokens: int = 1000,
    history_tokens: int = 0,
    max_output_tokens: int = 100,
    session_id: str = "s1",
    arrival_s: float = 0.0,
    request_id: str = "r1",
) -> Request:
    return Request(
        request_id=request_id,
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_output_tokens,
        session_id=session_id,
        history_tokens=history_tokens,
        content=((1, prompt_tokens),),
    )
