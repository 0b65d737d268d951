"""One simulation of a sweep: a :class:`Job` (deployment, split, rate), the jobs a spec asks for,
and :func:`run_job`, which every executor (:mod:`tokenomy.experiment.sweep`) runs on a worker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenomy.core import Session
from tokenomy.engine import EventTrace
from tokenomy.experiment.results import RunResult
from tokenomy.experiment.spec import DeploymentSpec, ExperimentSpec
from tokenomy.experiment.splits import Split
from tokenomy.sim import simulate
from tokenomy.sim.runner import ProgressFn
from tokenomy.workload import WorkloadInfo, load_workload_info


@dataclass(frozen=True)
class Job:
    """One simulation of a sweep."""

    deployment: DeploymentSpec
    split: Split | None
    rate_per_s: float | None


def load_sessions(spec: ExperimentSpec, rate_per_s: float | None = None) -> tuple[list[Session], WorkloadInfo]:
    """The spec's workload (at ``rate_per_s`` when given, else the spec's own rate)."""
    w = spec.workload
    return load_workload_info(
        w.source, format=w.format, rate_per_s=rate_per_s if rate_per_s is not None else w.rate_per_s,
        duration_s=w.duration_s, seed=w.seed, arrival=w.arrival, arrival_cv=w.arrival_cv,
        max_sessions=w.max_sessions, tenants=w.tenants,
    )


def run_job(spec: ExperimentSpec, job: Job, sessions: Sequence[Session] | None = None,
            progress: ProgressFn | None = None, trace: EventTrace | None = None) -> RunResult:
    """Simulate one job (loading its sessions unless given); ``trace`` takes engine events and policy decisions."""
    if sessions is None:
        sessions = load_sessions(spec, job.rate_per_s)[0]
    config = spec.sim_config(job.deployment, job.split)
    result = simulate(sessions, config, spec.slo, progress=progress, trace=trace,
                      decision_trace=trace.emit if trace is not None else None)
    return RunResult(job.deployment.label, job.split, job.rate_per_s, result.summary, result.num_gpus,
                     result.sim_end_s, result.wall_s, kv_transfers=result.transfers.to_dict())


def plan_jobs(spec: ExperimentSpec) -> list[Job]:
    """Every (deployment, split, rate) the spec asks for; ``rates`` None gives one rate, the spec's own."""
    rates: Sequence[float | None] = spec.rates if spec.rates is not None else [None]
    return [Job(d, split, r) for d in spec.deployments for split in spec.splits_of(d) for r in rates]
