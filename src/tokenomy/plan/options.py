"""Candidate instance shapes and the (shape, count) options the MILP chooses among.

A candidate is a role (prefill, decode or mixed) on one GPU type at one TP degree within a
node. An option is a candidate run ``count`` times behind one load-aware router: each
instance carries ``1/count`` of the demand on average, and the pool queues as one M/G/c
queue with ``c = count`` (:class:`~tokenomy.plan.queueing.InstanceModel`), not as ``count``
independent queues. Its *score* is its
P95 over the SLO bound (TTFT for prefill, TPOT for decode, the larger of both for mixed):
1.0 means exactly at the SLO. Its *attainment* is the predicted share of its requests within
the bounds it serves (the MILP's feasibility: a plan's attainment is the product of its roles').
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenomy.core import SLO
from tokenomy.perf import PerfModel, get_gpu
from tokenomy.plan.queueing import InstanceModel, Prediction
from tokenomy.plan.stats import WorkloadStats

ROLES = ("prefill", "decode", "mixed")
TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class EngineLimits:
    """Engine knobs every instance runs with (the simulator's defaults, vLLM's names)."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    decode_max_num_seqs: int = 512
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True, order=True)
class Candidate:
    """One instance shape: ``role`` on ``tp`` GPUs of type ``gpu`` (canonical catalog name)."""

    role: str
    gpu: str
    tp: int

    @property
    def key(self) -> str:
        return f"{self.role}:{self.gpu}:tp{self.tp}"


@dataclass(frozen=True)
class Option:
    """``count`` instances of ``candidate`` and what they are predicted to do at the demand."""

    candidate: Candidate
    count: int
    prediction: Prediction
    score: float
    hit: float = 1.0

    @property
    def gpus(self) -> int:
        return self.count * self.candidate.tp

    @property
    def attainment(self) -> float:
        """Predicted share of requests within the SLO bounds this role serves (0 if infeasible)."""
        return self.prediction.attainment if self.prediction.feasible else 0.0

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * get_gpu(self.candidate.gpu).usd_per_gpu_hour


def build_models(
    model: str, inventory: dict[str, int], stats: WorkloadStats, limits: EngineLimits, gpus_per_node: int,
    tp_choices: Iterable[int] = TP_CHOICES,
) -> tuple[dict[Candidate, InstanceModel], list[str]]:
    """An :class:`InstanceModel` per candidate whose weights fit; and why the others do not.

    TP is limited to the GPUs of one node (``gpus_per_node``) and to the inventory of the type.
    """
    models: dict[Candidate, InstanceModel] = {}
    misfits: list[str] = []
    for gpu, count in sorted(inventory.items()):
        for tp in sorted(tp_choices):
            if tp > min(count, gpus_per_node):
                continue
            try:
                perf = PerfModel.from_names(model, gpu, tp)
                perf.kv_capacity_tokens(limits.gpu_memory_utilization)
            except ValueError as exc:
                misfits.append(str(exc))
                continue
            for role in ROLES:
                seqs = limits.decode_max_num_seqs if role == "decode" else limits.max_num_seqs
                models[Candidate(role, gpu, tp)] = InstanceModel(
                    role, perf, stats, max_num_batched_tokens=limits.max_num_batched_tokens,
                    max_num_seqs=seqs, gpu_memory_utilization=limits.gpu_memory_utilization)
    return models, misfits


def score_of(role: str, p: Prediction, slo: SLO) -> float:
    """P95 over its SLO bound (the larger of TTFT and TPOT where a role has both)."""
    ttft = (p.ttft_p95_s or 0.0) / slo.ttft_s
    tpot = (p.tpot_p95_s or 0.0) / slo.tpot_s
    return {"prefill": ttft, "decode": tpot}.get(role, max(ttft, tpot))


def evaluate(cand: Candidate, model: InstanceModel, count: int, stats: WorkloadStats, slo: SLO) -> Option:
    """``count`` instances of ``cand`` behind one router, pooled (score ``inf`` if infeasible)."""
    hit = model.hit_fraction(count)
    p = model.predict(stats.request_rate_per_s / count, hit, servers=count, slo=slo)
    return Option(cand, count, p, score_of(cand.role, p, slo) if p.feasible else float("inf"), hit)


def enumerate_options(
    models: dict[Candidate, InstanceModel], inventory: dict[str, int], stats: WorkloadStats, slo: SLO,
) -> list[Option]:
    """Every feasible (candidate, count) within the inventory of its GPU type."""
    out = []
    for cand, model in sorted(models.items()):
        for count in range(1, inventory[cand.gpu] // cand.tp + 1):
            opt = evaluate(cand, model, count, stats, slo)
            if opt.prediction.feasible:
                out.append(opt)
    return out
