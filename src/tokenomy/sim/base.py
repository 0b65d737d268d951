"""What every simulated deployment shares: the context it runs in and the record it emits."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenomy.core import SLO, Request, RequestRecord, Role, TokenUsage
from tokenomy.core.errors import UnknownNameError
from tokenomy.engine import Engine, EngineConfig, EventTrace, FinishedRequest, KeyChainCache, StepResult
from tokenomy.perf import PerfModel
from tokenomy.policy.trace import TraceSink
from tokenomy.sim.config import SimConfig
from tokenomy.sim.instance import PooledItl, SimInstance
from tokenomy.sim.link import KVFabric
from tokenomy.sim.loop import EventLoop

DoneCallback = Callable[[Request, RequestRecord], None]


@dataclass
class SimContext:
    """Shared by the driver and a deployment during one simulation."""

    loop: EventLoop
    perf: PerfModel
    config: SimConfig
    done: DoneCallback
    slo: SLO = field(default_factory=SLO)
    itl: PooledItl = field(default_factory=PooledItl)  # the instances add to it (SimInstance)
    # One thread drives every engine: they share key chains (the router hashes a prompt once).
    key_chains: KeyChainCache = field(default_factory=KeyChainCache)
    trace: EventTrace | None = None
    decision_trace: TraceSink | None = None  # receives every policy decision (tokenomy.policy.trace)
    role_perf: dict[Role, PerfModel] = field(default_factory=dict)
    """Per-role step-time models where a role's instances differ from ``perf`` (SimConfig.role_shape)."""



def usage_of(request: Request, prefill_side: FinishedRequest, output_tokens: int, extra_preempted: int = 0) -> TokenUsage:
    """Token classes of a request: origin of the prompt from the request, work from the prefill side."""
    first_turn = request.turn == 0 and request.history_tokens == 0
    return TokenUsage(
        input_tokens=request.new_tokens if first_turn else 0,
        incremental_prefill_tokens=0 if first_turn else request.new_tokens,
        history_tokens=request.history_tokens,
        output_tokens=output_tokens,
        cache_hit_tokens=prefill_side.cache_hit_tokens + prefill_side.transferred_tokens,
        recomputed_tokens=prefill_side.recomputed_tokens,
        transferred_tokens=prefill_side.transferred_tokens,
        preempted_recompute_tokens=prefill_side.preempted_recompute_tokens + extra_preempted,
    )


def record_of(
    request: Request,
    usage: TokenUsage,
    *,
    first_token_s: float | None,
    finish_s: float | None,
    output_tokens: int,
    max_itl_s: float,
    preemptions: int,
    prefill_instance: str,
    decode_instance: str,
    finished: bool = True,
) -> RequestRecord:
    return RequestRecord(
        request_id=request.request_id,
        arrival_s=request.arrival_s,
        first_token_s=first_token_s,
        finish_s=finish_s,
        prompt_tokens=request.prompt_tokens,
        output_tokens=output_tokens,
        session_id=request.session_id,
        turn=request.turn,
        tenant=request.tenant,
        tier=request.tier,
        usage=usage,
        max_itl_s=max_itl_s,
        preemptions=preemptions,
        finished=finished,
        prefill_instance=prefill_instance,
        decode_instance=decode_instance,
    )


def incomplete_record(request: Request, prefill: FinishedRequest, prefill_instance: str) -> RequestRecord:
    """A request whose prefill ran but whose KV never reached its decode instance (a transfer
    cut by its timeout): no first token, not finished, its prefill work still counted."""
    return record_of(
        request,
        usage_of(request, prefill, 0),
        first_token_s=None,
        finish_s=None,
        output_tokens=0,
        max_itl_s=0.0,
        preemptions=prefill.num_preemptions,
        prefill_instance=prefill_instance,
        decode_instance="",
        finished=False,
    )


def single_record(request: Request, fin: FinishedRequest, instance_id: str) -> RequestRecord:
    """Record of a request that one instance prefilled and decoded."""
    return record_of(
        request,
        usage_of(request, fin, fin.output_tokens),
        first_token_s=fin.first_token_s,
        finish_s=fin.finish_s,
        output_tokens=fin.output_tokens,
        max_itl_s=fin.max_itl_s,
        preemptions=fin.num_preemptions,
        prefill_instance=instance_id,
        decode_instance=instance_id,
    )


def split_record(
    request: Request,
    prefill: FinishedRequest,
    decode: FinishedRequest | None,
    *,
    kv_arrived_s: float | None,
    prefill_instance: str,
    decode_instance: str,
) -> RequestRecord:
    """Record of a request prefilled on one instance and decoded on another.

    The client streams from the decode side (vLLM's P/D protocol, which the live gateway
    speaks: the prefill side's token is not sent), so its first token is the decode side's
    first token: the KV transfer and any wait for the decode instance to admit the request
    (free KV blocks, a batch slot) are TTFT, as ``vllm bench serve`` measures it. (Before
    2026-12-01 the first token was stamped at ``kv_arrived_s`` and that wait was spread over
    TPOT as one long inter-token gap, which flattered every split deployment.) A one-token
    answer (``decode`` None) is served by the prefill side alone. ``kv_arrived_s`` stands in
    only for a decode side that emitted nothing.
    """
    if decode is None:
        first, finish, out, itl = prefill.first_token_s, prefill.finish_s, prefill.output_tokens, 0.0
        preemptions, extra = prefill.num_preemptions, 0
    else:
        first = decode.first_token_s if decode.first_token_s is not None else kv_arrived_s
        finish = decode.finish_s
        out = prefill.output_tokens + decode.output_tokens
        itl = decode.max_itl_s
        preemptions = prefill.num_preemptions + decode.num_preemptions
        extra = decode.preempted_recompute_tokens
    return record_of(
        request,
        usage_of(request, prefill, out, extra_preempted=extra),
        first_token_s=first,
        finish_s=finish,
        output_tokens=out,
        max_itl_s=itl,
        preemptions=preemptions,
        prefill_instance=prefill_instance,
        decode_instance=decode_instance,
    )


class Deployment(ABC):
    """A set of simulated engine instances and the logic that moves requests between them."""

    name: str = ""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self.instances: list[SimInstance] = []
        self.fabric: KVFabric | None = None  # its KV network, if it moves KV (stats go in the result)

    def _make_instance(
        self, instance_id: str, role: Role, max_num_batched_tokens: int | None = None, perf: PerfModel | None = None
    ) -> SimInstance:
        cfg = self.ctx.config
        max_num_seqs = cfg.decode_max_num_seqs if role is Role.DECODE else cfg.max_num_seqs
        perf = perf or self.ctx.role_perf.get(role, self.ctx.perf)
        engine_cfg = EngineConfig(
            num_gpu_blocks=perf.num_kv_blocks(cfg.block_size_tokens, cfg.gpu_memory_utilization),
            block_size_tokens=cfg.block_size_tokens,
            max_num_batched_tokens=max_num_batched_tokens or cfg.max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=cfg.enable_prefix_caching,
        )
        engine = Engine(instance_id, engine_cfg, perf, role=role, key_chains=self.ctx.key_chains, trace=self.ctx.trace)
        inst = SimInstance(engine, self.ctx.loop, self._on_step,
                           pooled_itl=self.ctx.itl)
        self.instances.append(inst)
        return inst

    def _make_decodes(self, max_num_batched_tokens: int) -> list[SimInstance]:
        """The decode pool: ``prefill_type_decodes`` instances of the prefill role's shape, then
        ``decode`` of the decode role's (``decode-0``, ``decode-1``, ... in that order)."""
        cfg = self.ctx.config
        alt = self.ctx.role_perf.get(Role.PREFILL, self.ctx.perf)
        n = cfg.prefill_type_decodes
        return [
            self._make_instance(f"decode-{i}", Role.DECODE, max_num_batched_tokens=max_num_batched_tokens,
                                perf=alt if i < n else None)
            for i in range(n + cfg.decode)
        ]

    def _on_step(self, instance: SimInstance, result: StepResult) -> None:
        """A step that finished requests (every step while ``instance.every_step``); the instance
        keeps the pooled ITL samples (``ctx.itl``) itself."""
        for fin in result.finished:
            self.on_finished(instance, fin)

    @property
    def max_request_tokens(self) -> int:
        """Prompt plus output tokens that one instance's KV cache can hold."""
        return min(inst.engine.config.total_kv_tokens for inst in self.instances)

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus_of(inst) for inst in self.instances)

    def gpus_of(self, instance: SimInstance) -> int:
        """GPUs one instance spans."""
        perf = instance.engine.perf
        return perf.tp if isinstance(perf, PerfModel) else self.ctx.config.tp

    @abstractmethod
    def submit(self, request: Request, now: float) -> None:
        """A request arrives at the cluster's front door."""

    @abstractmethod
    def on_finished(self, instance: SimInstance, fin: FinishedRequest) -> None:
        """An engine finished (its part of) a request."""

    @abstractmethod
    def unfinished(self) -> list[Request]:
        """Requests still in the system (for the horizon cut-off)."""


DEPLOYMENTS: dict[str, type[Deployment]] = {}


def register_deployment(cls: type[Deployment]) -> type[Deployment]:
    if not cls.name or cls.name in DEPLOYMENTS:
        raise ValueError(f"deployment name {cls.name!r} is empty or already registered")
    DEPLOYMENTS[cls.name] = cls
    return cls


def get_deployment(name: str) -> type[Deployment]:
    try:
        return DEPLOYMENTS[name]
    except KeyError:
        raise UnknownNameError(f"unknown deployment {name!r}; known: {', '.join(sorted(DEPLOYMENTS))}") from None
