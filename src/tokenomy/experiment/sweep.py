"""Run an :class:`ExperimentSpec`: one run per deployment (``sim``) or a sweep (``sim compare``).

A sweep is a list of :class:`Job` values (deployment, split, rate); each job travels to a
worker with the spec (both frozen dataclasses), the worker loads the workload itself
(deterministic by seed) and returns a typed :class:`RunResult`. Executors are registered by
name in :data:`EXECUTORS`: ``"inline"`` (this process), ``"pool"`` (a local process pool) and
``"ray"`` (a Ray cluster, optional extra ``tokenomy[ray]``). Every executor returns the same
numbers for the same spec: the simulator is deterministic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from tokenomy.core import Session
from tokenomy.engine import EventTrace
from tokenomy.experiment.results import Curve, RunResult, SweepResult
from tokenomy.experiment.spec import DeploymentSpec, ExperimentSpec, Split
from tokenomy.sim import simulate
from tokenomy.sim.runner import ProgressFn
from tokenomy.workload import WorkloadInfo, load_workload_info


@dataclass(frozen=True)
class Job:
    """One simulation of a sweep."""

    deployment: DeploymentSpec
    split: Split | None
    rate_per_s: float | None


@dataclass(frozen=True)
class Progress:
    """Handed to a sweep's progress callback after each finished job."""

    done: int
    total: int
    elapsed_s: float
    job: Job
    result: RunResult

    @property
    def eta_s(self) -> float:
        return self.elapsed_s / self.done * (self.total - self.done) if self.done else float("nan")


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


Executor = Callable[[ExperimentSpec, list[Job], int, str | None], Iterator[tuple[Job, RunResult]]]
"""``(spec, jobs, workers, address) -> (job, result)`` pairs in completion order."""


def _inline(spec: ExperimentSpec, jobs: list[Job], workers: int, address: str | None) -> Iterator[tuple[Job, RunResult]]:
    for job in jobs:
        yield job, run_job(spec, job)


def _pool(spec: ExperimentSpec, jobs: list[Job], workers: int, address: str | None) -> Iterator[tuple[Job, RunResult]]:
    if workers <= 1 or len(jobs) <= 1:
        yield from _inline(spec, jobs, workers, address)
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = {pool.submit(run_job, spec, job): job for job in jobs}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def _ray(spec: ExperimentSpec, jobs: list[Job], workers: int, address: str | None) -> Iterator[tuple[Job, RunResult]]:
    from tokenomy.experiment.ray_executor import run_on_ray

    yield from run_on_ray(spec, jobs, workers, address)


EXECUTORS: dict[str, Executor] = {"inline": _inline, "pool": _pool, "ray": _ray}


def get_executor(name: str) -> Executor:
    try:
        return EXECUTORS[name]
    except KeyError:
        raise ValueError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}") from None


def run_jobs(
    spec: ExperimentSpec,
    jobs: list[Job],
    *,
    executor: str = "pool",
    workers: int | None = None,
    address: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict[Job, RunResult]:
    """Run ``jobs`` on the named executor (``workers`` default: all cores); results by job."""
    run = get_executor(executor)
    n = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    out: dict[Job, RunResult] = {}
    for job, result in run(spec, jobs, n, address):
        out[job] = result
        if on_progress is not None:
            on_progress(Progress(len(out), len(jobs), time.perf_counter() - t0, job, result))
    return out


def run_sweep(
    spec: ExperimentSpec,
    *,
    executor: str = "pool",
    workers: int | None = None,
    address: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> SweepResult:
    """Sweep ``spec.rates`` over every deployment and split; keep each deployment's best split.

    The best split has the highest ``max_rate_at_target``, then the highest mean attainment
    (ties keep the first listed split). Raises ValueError if the spec has no rates.
    """
    if spec.rates is None:
        raise ValueError("a sweep needs rates (--rates)")
    jobs = plan_jobs(spec)
    results = run_jobs(spec, jobs, executor=executor, workers=workers, address=address, on_progress=on_progress)
    best: dict[str, Curve] = {}
    tried: dict[str, tuple[Curve, ...]] = {}
    for dep in spec.deployments:
        curves = tuple(
            Curve(dep.label, split, spec.rates, tuple(results[Job(dep, split, r)] for r in spec.rates),
                  spec.attainment_target)
            for split in spec.splits_of(dep)
        )
        tried[dep.label] = curves
        best[dep.label] = max(curves, key=Curve.score)  # max keeps the first of equal scores
    info = _describe_workload(spec)
    return SweepResult(spec, best, tried, info)


def _describe_workload(spec: ExperimentSpec) -> dict[str, Any]:
    w = spec.workload
    return {"source": w.source, "format": w.format, "seed": w.seed}
