"""Typed configuration of one simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenomy.policy.ampd import BindingConfig, PlacementConfig, ReorderConfig, RetentionConfig
from tokenomy.sim.admission_options import AdmissionOptions


@dataclass(frozen=True)
class AMPDOptions:
    """Which AMPD mechanisms run (each can be switched off for ablation) and their policy configs.

    ``admission``: turns waiting for a memory-full decode instance are admitted in slack order
    (:class:`~tokenomy.policy.ampd.SlackAdmission`) instead of FIFO.
    With every switch off, ``ampd`` degenerates to PD disaggregation that ships only the KV the
    decode side lacks. ``tool_latency_prior_s`` is the expected tool time assumed for a session
    before any tool call has been observed (a labelled default; afterwards the running mean of
    observed gaps is used). ``host_kv_bytes_per_gpu`` is the host memory each decode GPU may use
    for offloaded KV (a labelled default: a DGX H100 has 2 TB of host memory for 8 GPUs; we
    take half of its 256 GB share); copies beyond it are evicted least recently stored first.
    """

    binding: bool = True
    placement: bool = True
    reorder: bool = True
    retention: bool = True
    admission: bool = True
    link_aware: bool = True  # placement adds the KV ports' queueing to a remote prefill's TTFT
    # A local turn that would wait for memory on its decode instance moves, with its history, to a
    # decode instance with room; admission then counts reloaded history as blocks (held_move.py).
    move_held_turns: bool = True
    # A later turn that would queue behind prefill work on its decode instance moves, with its
    # history, to a decode instance that starts it sooner by a margin (turn_move.py).
    move_queued_turns: bool = True
    # With ``placement_config.tpot_bank``: the bank is forward-looking, each young stream counting the
    # tokens it is still expected to emit (a low quantile of finished turns' outputs, learned online;
    # OutputLengths, engine/tpot_bank.py). Off by default: it shortens the TTFT tail where decodes
    # have TPOT to spare (the grid's point (a)) and costs TPOT where they run at their SLO (point
    # (d)); variant ``ampd-forward-bank``.
    tpot_bank_forward: bool = False
    binding_config: BindingConfig = field(default_factory=BindingConfig)
    # Decode-side chunks of at most 512 tokens (decodes included) keep a local prefill's ITL cost
    # small; 2048 (vLLM's default) priced most local prefills out on GAIA (docs/ampd-results.md).
    # Each local prefill's chunk is sized down to the decode batch's ITL slack, or up to what the
    # streams' banked TPOT slack pays for (``tpot_bank``; docs/ampd.md).
    placement_config: PlacementConfig = field(
        default_factory=lambda: PlacementConfig(local_budget_tokens=512, size_local_chunks=True, tpot_bank=True)
    )
    reorder_config: ReorderConfig = field(default_factory=ReorderConfig)
    retention_config: RetentionConfig = field(default_factory=RetentionConfig)
    tool_latency_prior_s: float = 5.0
    host_kv_bytes_per_gpu: float = 128 * 2**30

    def __post_init__(self) -> None:
        if self.tool_latency_prior_s < 0:
            raise ValueError(f"tool_latency_prior_s must be >= 0, got {self.tool_latency_prior_s}")
        if self.host_kv_bytes_per_gpu < 0:
            raise ValueError(f"host_kv_bytes_per_gpu must be >= 0, got {self.host_kv_bytes_per_gpu}")


@dataclass(frozen=True)
class SimConfig:
    """A deployment of one model on GPUs of one kind.

    ``instances`` is used by colocated deployments; ``prefill`` and ``decode`` by
    disaggregated ones (``ampd`` may have ``prefill=0``: every turn prefills on its session's
    decode instance). Each instance spans ``tp`` GPUs. Engine knobs mirror vLLM's
    (``max_num_batched_tokens``, ``max_num_seqs``, ``block_size``, ``gpu_memory_utilization``);
    decode-only instances run larger batches (``decode_max_num_seqs``), as PD deployments
    configure them, since they carry no prefill.
    ``link_bytes_per_s`` is the KV-transfer bandwidth into one instance (default: the GPU's
    inter-node bandwidth times ``tp``). ``horizon_s`` cuts the run: requests not finished by
    then are recorded as unfinished (default: no cut, run until drained). ``host_kv_tier`` gives
    colocated and disaggregated deployments the host KV tier, PCIe model and retention policies
    of AMPD (``ampd``'s retention config and host memory), for fair comparisons.
    ``prefill_tp``/``prefill_gpu`` and ``decode_tp``/``decode_gpu`` give a disaggregated
    deployment's roles their own instance shape (default: ``tp`` and ``gpu``); ``disagg`` and
    ``ampd`` run them (heterogeneous pools: compute-rich prefill, bandwidth-rich decode).
    ``mixed_pools`` runs a colocated deployment on a mixed inventory: ``(gpu, tp, instances)``
    per GPU type, every instance mixed (``instances``, ``gpu`` and ``tp`` then only name the
    first pool). ``gpus_per_node``: instances fill nodes of that many GPUs in order, and KV
    moves over NVLink inside a node and over RDMA NICs across nodes (None: every instance is
    its own node). ``prefill_type_decodes``: decode instances of the prefill role's GPU and TP,
    ahead of the ``decode`` instances of the decode role's shape (``disagg`` and ``ampd`` on a
    mixed inventory whose compute-rich type also decodes: ``prefill`` of its instances prefill,
    the rest decode beside the other type). ``kv_transfer_timeout_s``: a KV transfer still in flight after that long is
    cut and its request recorded as incomplete (None: no timeout).
    ``calibration`` is a file from ``tokenomy perf profile``: steps cost what the profiled
    engine's fitted model says, and its limits (block size, KV blocks, token budget, batch
    limit) replace these fields wherever it recorded them (see :func:`tokenomy.sim.runner.calibrated`).
    """

    deployment: str = "colocated"
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    instances: int = 8
    prefill: int = 4
    decode: int = 4
    router: str = "prefix_aware"
    decode_router: str = "least_loaded"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    decode_max_num_seqs: int = 512
    block_size_tokens: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    link_bytes_per_s: float | None = None
    horizon_s: float | None = None
    host_kv_tier: bool = False  # baselines: AMPD's host KV tier and retention policies (LMCache-style)
    prefill_tp: int | None = None
    decode_tp: int | None = None
    prefill_gpu: str | None = None
    decode_gpu: str | None = None
    mixed_pools: tuple[tuple[str, int, int], ...] | None = None
    prefill_type_decodes: int = 0
    gpus_per_node: int | None = None
    kv_transfer_timeout_s: float | None = None
    calibration: str | None = None
    ampd: AMPDOptions = field(default_factory=AMPDOptions)
    admission: AdmissionOptions | None = None  # a closed-loop front door (sim/admission_gate.py); None: none

    def __post_init__(self) -> None:
        for name in ("tp", "instances", "prefill", "decode", "max_num_batched_tokens", "max_num_seqs",
                     "decode_max_num_seqs", "block_size_tokens"):
            if getattr(self, name) < (0 if name == "prefill" and self.deployment == "ampd" else 1):
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}"
                                 + (" (0 prefill instances only for ampd)" if name == "prefill" else ""))
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.link_bytes_per_s is not None and self.link_bytes_per_s <= 0:
            raise ValueError(f"link_bytes_per_s must be positive, got {self.link_bytes_per_s}")
        if self.horizon_s is not None and self.horizon_s <= 0:
            raise ValueError(f"horizon_s must be positive, got {self.horizon_s}")
        for name in ("prefill_tp", "decode_tp"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.has_role_shapes and self.calibration is not None:
            raise ValueError("a calibration describes one engine: per-role tp/gpu do not apply to it")
        if self.mixed_pools is not None and self.calibration is not None:
            raise ValueError("a calibration describes one engine: mixed_pools do not apply to it")
        if self.has_role_shapes and self.deployment not in ("disagg", "ampd"):
            raise ValueError(f"per-role tp/gpu are supported by disagg and ampd, not {self.deployment!r}")
        if self.mixed_pools is not None:
            if self.deployment != "colocated":
                raise ValueError(f"mixed_pools are for colocated deployments, not {self.deployment!r}")
            if not self.mixed_pools or any(tp < 1 or n < 1 for _, tp, n in self.mixed_pools):
                raise ValueError(f"mixed_pools need (gpu, tp >= 1, instances >= 1) each, got {self.mixed_pools}")
        if self.prefill_type_decodes < 0:
            raise ValueError(f"prefill_type_decodes must be >= 0, got {self.prefill_type_decodes}")
        if self.prefill_type_decodes and self.deployment not in ("disagg", "ampd"):
            raise ValueError(f"prefill_type_decodes are for disagg and ampd, not {self.deployment!r}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.kv_transfer_timeout_s is not None and not self.kv_transfer_timeout_s > 0:
            raise ValueError(f"kv_transfer_timeout_s must be > 0, got {self.kv_transfer_timeout_s}")

    @property
    def has_role_shapes(self) -> bool:
        """Whether a role's instances differ from ``tp``/``gpu`` (see the class docstring)."""
        shapes = (self.prefill_tp, self.decode_tp, self.prefill_gpu, self.decode_gpu)
        return any(v is not None for v in shapes)

    def role_shape(self, role: str) -> tuple[str, int]:
        """``(gpu, tp)`` of a ``"prefill"`` or ``"decode"`` instance."""
        if role == "prefill":
            return self.prefill_gpu or self.gpu, self.prefill_tp or self.tp
        if role == "decode":
            return self.decode_gpu or self.gpu, self.decode_tp or self.tp
        raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
