"""Configuration of one emulated engine instance (flags of ``tokenomy emulate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenomy.core import Role
from tokenomy.engine import EngineConfig
from tokenomy.perf import PerfModel

DEFAULT_MAX_MODEL_LEN = 32768
"""Context window when ``--max-model-len`` is not given and the model's own window
(``max_position_embeddings``) is not known (labelled default); capped by the instance's KV capacity."""

DEFAULT_EOS_MEAN_TOKENS = 256.0
"""Mean output length of the EOS rule when a request neither sets ``ignore_eos`` nor hits
``max_tokens`` first (labelled default, no published evidence)."""

DEFAULT_KV_RELEASE_TIMEOUT_S = 30.0
"""How long a prefill-role instance keeps a finished request's KV for a decode instance to pull
(labelled default; vLLM's NixlConnector waits minutes, ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``)."""

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_DECODE_MAX_NUM_SEQS = 512
"""Decode-only instances run larger batches, as ``tokenomy sim`` configures them (``decode_max_num_seqs``)."""


def default_max_num_seqs(role: Role) -> int:
    return DEFAULT_DECODE_MAX_NUM_SEQS if Role(role) is Role.DECODE else DEFAULT_MAX_NUM_SEQS


DEFAULT_MAX_LAG_S = 0.02

# Labelled default: the largest request body the server reads (vLLM has no such limit; a 128k-token
# prompt is ~0.5 MB of text, so 16 MiB leaves room for token-id prompts and images as data URLs).
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""How far the wall clock may run behind the model before the model re-anchors to it (see
docs/emulator.md, "Fidelity"): bounded catch-up after a hiccup, no unbounded drift when CPU-bound."""


@dataclass(frozen=True)
class EmulatorConfig:
    """One instance: the modelled hardware, engine limits, and the server's own rules.

    Engine knobs mirror ``tokenomy sim`` (``max_num_batched_tokens``, ``max_num_seqs``,
    ``block_size_tokens``, ``gpu_memory_utilization``, ``enable_prefix_caching``).
    ``trace_events``: write the engine's event trace there as JSON lines (``t_s`` in modelled
    seconds since the server started), as ``tokenomy sim --trace-events`` does.
    ``time_scale`` is wall seconds per modelled second (1.0: real time; 0.1 runs ten times
    faster; latencies in ``/metrics`` are always in modelled seconds).
    """

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    role: Role = Role.MIXED
    served_model_name: str | None = None
    instance_id: str = "emulator-0"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size_tokens: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    tokenizer: Path | None = None
    trace_events: Path | None = None
    eos_mean_tokens: float = DEFAULT_EOS_MEAN_TOKENS
    kv_release_timeout_s: float = DEFAULT_KV_RELEASE_TIMEOUT_S
    link_bytes_per_s: float | None = None
    kv_transfer_timeout_s: float | None = None
    time_scale: float = 1.0
    max_lag_s: float = DEFAULT_MAX_LAG_S
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Hosts a decode instance may notify (kv_transfer_params.remote_host) besides loopback: the
    # host comes from a request body, so any other host would let a client make it POST anywhere.
    kv_peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tp", "max_num_batched_tokens", "max_num_seqs", "block_size_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"--num-gpu-blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2, got {self.max_model_len}")
        if self.eos_mean_tokens < 0:
            raise ValueError(f"--eos-mean-tokens must be >= 0, got {self.eos_mean_tokens}")
        if self.kv_release_timeout_s <= 0:
            raise ValueError(f"--kv-release-timeout must be > 0, got {self.kv_release_timeout_s}")
        if self.link_bytes_per_s is not None and self.link_bytes_per_s <= 0:
            raise ValueError(f"--link-gbps must be > 0, got {self.link_bytes_per_s / 1e9}")
        if self.kv_transfer_timeout_s is not None and not self.kv_transfer_timeout_s > 0:
            raise ValueError(f"--kv-transfer-timeout must be > 0, got {self.kv_transfer_timeout_s}")
        if self.time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0, got {self.time_scale}")
        if self.max_lag_s < 0:
            raise ValueError(f"--max-lag-ms must be >= 0, got {self.max_lag_s * 1e3}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        object.__setattr__(self, "role", Role(self.role))

    @property
    def model_name(self) -> str:
        """The name clients send as ``model`` (``--served-model-name``, default ``--model``)."""
        return self.served_model_name or self.model

    def perf_model(self) -> PerfModel:
        return PerfModel.from_names(self.model, self.gpu, self.tp)

    def engine_config(self, perf: PerfModel) -> EngineConfig:
        blocks = self.num_gpu_blocks or perf.num_kv_blocks(self.block_size_tokens, self.gpu_memory_utilization)
        return EngineConfig(
            num_gpu_blocks=blocks,
            block_size_tokens=self.block_size_tokens,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching,
        )

    def context_window(self, engine: EngineConfig, model_window: int | None = None) -> int:
        """Most prompt + output tokens one request may have: ``max_model_len``, else the model's
        own window ``model_window`` (as vLLM defaults it), else :data:`DEFAULT_MAX_MODEL_LEN`;
        capped by the KV capacity."""
        want = self.max_model_len or model_window or DEFAULT_MAX_MODEL_LEN
        return min(want, engine.total_kv_tokens)
