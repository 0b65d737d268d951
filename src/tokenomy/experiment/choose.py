"""Which deployment to run: AMPD, PD disaggregation or colocated, with or without the host KV tier.

The planner's MILP (:mod:`tokenomy.plan`) sizes pools from a queueing model; it cannot see
what separates these deployments (KV memory across tool calls, prefill/decode interference,
history shipped between instances, link queueing). So the choice is made the way a careful
operator would make it: simulate each candidate on the same GPUs at the rate to serve, on an
independent sample of the workload (another seed than the one the caller reports on), and
take the one whose SLO attainment at that rate is highest; candidates within half a point of
the best tie, and ties go to the one on fewer GPUs, then to the lower P99 TTFT. The answer says
why, in numbers: the winner's attainment and tails beside each other candidate's.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from tokenomy.experiment.jobs import Job, run_job
from tokenomy.experiment.results import RunResult
from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec
from tokenomy.experiment.splits import Split
from tokenomy.experiment.sweep import run_jobs
from tokenomy.plan.planner import Plan

TIE_ATTAINMENT = 0.005
"""Attainments this close to the best count as a tie (half a point: below a sample's noise)."""

CANDIDATES = ("colocated", "colocated-offload", "disagg", "disagg-offload", "ampd")
"""What ``choose_deployment`` compares by default (the spec's splits apply to the disaggregated)."""


@dataclass(frozen=True)
class Choice:
    """The deployment to run and every candidate's simulated result at the planning rate."""

    deployment: str
    split: Split | None
    rate_per_s: float
    results: tuple[RunResult, ...]
    why: str
    gpus: str = ""  # the chosen candidate's inventory (``ClusterSpec.gpus``; "" on one GPU type)

    @property
    def label(self) -> str:
        return f"{self.deployment}@{self.split[0]}:{self.split[1]}" if self.split else self.deployment

    @property
    def predicted_goodput_rps(self) -> float:
        return self._chosen.summary.goodput_rps

    @property
    def _chosen(self) -> RunResult:
        # a candidate with a pinned split is labelled ``name@P:D``
        return next(r for r in self.results
                    if r.deployment.partition("@")[0] == self.deployment and r.split == self.split)

    def to_dict(self) -> dict[str, object]:
        return {
            "deployment": self.deployment,
            "label": self.label,
            "split": list(self.split) if self.split else None,
            "rate_per_s": self.rate_per_s,
            "predicted_goodput_rps": self.predicted_goodput_rps,
            "why": self.why,
            "gpus": self.gpus,
            "candidates": [
                {"deployment": r.deployment, "split": list(r.split) if r.split else None,
                 "slo_attainment": r.summary.slo_attainment, "goodput_rps": r.summary.goodput_rps,
                 "ttft_p99_s": r.summary.ttft_p99_s, "tpot_p99_s": r.summary.tpot_p99_s}
                for r in self.results
            ],
        }


def choose_deployment(
    spec: ExperimentSpec,
    rate_per_s: float,
    *,
    candidates: Sequence[str | DeploymentSpec] = CANDIDATES,
    seed_offset: int = 1,
    duration_s: float | None = None,
    workers: int = 1,
) -> Choice:
    """Simulate every candidate (a name, or a deployment with a pinned split) (at each of its splits in ``spec``) at ``rate_per_s`` on a sample
    of the workload drawn with ``spec.workload.seed + seed_offset`` (and ``duration_s`` if given),
    and choose the one with the highest SLO attainment (ties: fewer GPUs, then lower P99 TTFT)."""
    return choose_on([(spec, tuple(candidates))], rate_per_s, seed_offset=seed_offset, duration_s=duration_s,
                     workers=workers)


def choose_on(
    topologies: Sequence[tuple[ExperimentSpec, tuple[str | DeploymentSpec, ...]]],
    rate_per_s: float,
    *,
    seed_offset: int = 1,
    duration_s: float | None = None,
    workers: int = 1,
    executor: str = "pool",
    address: str | None = None,
) -> Choice:
    """:func:`choose_deployment` where candidates run on their own topologies (each spec's cluster:
    e.g. the planner's disaggregated pools for AMPD and disagg, its mixed pool for colocated).

    Every candidate of every topology is one job: ``executor`` ``"pool"`` runs them all at once on
    ``workers`` local processes, ``"ray"`` on the Ray cluster at ``address`` (one topology at a time)."""
    if not rate_per_s > 0:
        raise ValueError(f"the planning rate must be > 0, got {rate_per_s}")
    work: list[tuple[ExperimentSpec, Job, str]] = []  # (sample spec, job, the topology's inventory)
    for spec, candidates in topologies:
        workload = replace(spec.workload, seed=spec.workload.seed + seed_offset,
                           duration_s=duration_s if duration_s is not None else spec.workload.duration_s)
        deployments = tuple(c if isinstance(c, DeploymentSpec) else DeploymentSpec(c) for c in candidates)
        sample = replace(spec, workload=workload, deployments=deployments, rates=(rate_per_s,))
        work += [(sample, Job(d, split, rate_per_s), spec.cluster.gpus or "")
                 for d in deployments for split in sample.splits_of(d)]
    results = _run_all([(s, j) for s, j, _ in work], executor, workers, address)
    gpus = {id(r): g for r, (_, _, g) in zip(results, work, strict=True)}  # id(result) -> its inventory
    spec = topologies[0][0]
    order = {id(r): i for i, r in enumerate(results)}
    top = max(r.summary.slo_attainment for r in results)

    def key(r: RunResult) -> tuple[bool, int, float, int]:
        # Within TIE_ATTAINMENT of the best attainment every candidate serves the rate as well:
        # then the one on fewer GPUs, then the lower P99 TTFT, then the order listed.
        s = r.summary
        return (s.slo_attainment < top - TIE_ATTAINMENT, r.num_gpus,
                s.ttft_p99_s if s.ttft_p99_s is not None else float("inf"), order[id(r)])

    ranked = sorted(results, key=key)
    best = ranked[0]
    name = best.deployment.partition("@")[0]
    return Choice(name, best.split, rate_per_s, tuple(results), _why(best, ranked[1:], spec), gpus=gpus[id(best)])


def _run_all(work: list[tuple[ExperimentSpec, Job]], executor: str, workers: int,
             address: str | None) -> list[RunResult]:
    """Each ``(spec, job)``'s result, in order: all at once on a local pool, or spec by spec elsewhere."""
    if executor == "pool" and workers > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(work))) as pool:
            return list(pool.map(run_job, *zip(*work, strict=True)))
    out: list[RunResult] = []
    i = 0
    while i < len(work):  # consecutive jobs of one spec go together
        spec = work[i][0]
        jobs = []
        while i < len(work) and work[i][0] is spec:
            jobs.append(work[i][1])
            i += 1
        done = run_jobs(spec, jobs, executor=executor, workers=workers, address=address)
        out += [done[j] for j in jobs]
    return out


def plan_topologies(
    plan: Plan, workload: WorkloadSpec
) -> list[tuple[ExperimentSpec, tuple[str | DeploymentSpec, ...]]]:
    """The planner's disaggregated pools (for AMPD and disagg, with and without the host tier) and
    its mixed pool (for colocated, with and without it), as experiment specs on ``workload``."""
    req = plan.request
    sols = [s for s in (plan.solution, plan.other_mode) if s is not None]
    out: list[tuple[ExperimentSpec, tuple[str | DeploymentSpec, ...]]] = []
    for sol in sols:
        roles = {o.candidate.role: o for o in sol.chosen}
        base = ClusterSpec(model=req.model, max_num_batched_tokens=req.limits.max_num_batched_tokens,
                           max_num_seqs=req.limits.max_num_seqs, gpus_per_node=req.gpus_per_node)
        if "mixed" in roles:
            m = roles["mixed"]
            cluster = replace(base, gpu=m.candidate.gpu, tp=m.candidate.tp, instances=m.count)
            out.append((ExperimentSpec(workload=workload, cluster=cluster, deployments=(DeploymentSpec("colocated"),),
                                       slo=req.slo), ("colocated-offload", "colocated")))
        else:
            p, d = roles["prefill"], roles["decode"]
            cluster = replace(base, gpu=p.candidate.gpu, tp=p.candidate.tp, instances=p.count + d.count,
                              prefill_gpu=p.candidate.gpu, prefill_tp=p.candidate.tp,
                              decode_gpu=d.candidate.gpu, decode_tp=d.candidate.tp)
            out.append((ExperimentSpec(workload=workload, cluster=cluster, deployments=(DeploymentSpec("disagg"),),
                                       slo=req.slo, fixed_split=(p.count, d.count)),
                        ("ampd", "disagg-offload", "disagg")))
    return out


def _label(r: RunResult) -> str:
    return f"{r.deployment}@{r.split[0]}:{r.split[1]}" if r.split and "@" not in r.deployment else r.deployment


def _tails(r: RunResult) -> str:
    s = r.summary
    ttft = "-" if s.ttft_p99_s is None else f"{s.ttft_p99_s:.1f} s"
    tpot = "-" if s.tpot_p99_s is None else f"{s.tpot_p99_s * 1e3:.0f} ms"
    return f"{s.slo_attainment:.0%} in SLO, P99 TTFT {ttft}, P99 TPOT {tpot}"


def _why(best: RunResult, others: Sequence[RunResult], spec: ExperimentSpec) -> str:
    """The choice in numbers, and what limits the runner-up of each kind."""
    slo = spec.slo
    parts = [f"{_label(best)} on {best.num_gpus} GPUs: {_tails(best)}"]
    seen: set[str] = set()
    for r in others:
        kind = r.deployment.partition("@")[0]
        if kind in seen:
            continue
        seen.add(kind)
        s = r.summary
        limit = []
        if s.ttft_p99_s is not None and s.ttft_p99_s > slo.ttft_s:
            limit.append("TTFT")
        if s.tpot_p99_s is not None and s.tpot_p99_s > slo.tpot_s:
            limit.append("TPOT")
        bound = f", its tail misses {' and '.join(limit)}" if limit else ""
        parts.append(f"{_label(r)} on {r.num_gpus} GPUs: {_tails(r)}{bound}")
    return "; ".join(parts)
