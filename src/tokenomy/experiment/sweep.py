"""Run an :class:`ExperimentSpec`: one run per deployment (``sim``) or a sweep (``sim compare``).

A sweep is a list of :class:`~tokenomy.experiment.jobs.Job` values (deployment, split, rate);
each job travels to a worker with the spec (both frozen dataclasses), the worker loads the
workload itself (deterministic by seed) and returns a typed :class:`RunResult`. Executors are registered by
name in :data:`EXECUTORS`: ``"inline"`` (this process), ``"pool"`` (a local process pool) and
``"ray"`` (a Ray cluster, optional extra ``tokenomy[ray]``). Every executor returns the same
numbers for the same spec: the simulator is deterministic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from tokenomy.experiment.jobs import Job, plan_jobs, run_job
from tokenomy.experiment.ray_executor import run_on_ray
from tokenomy.experiment.results import Curve, RunResult, SweepResult
from tokenomy.experiment.spec import ExperimentSpec


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


EXECUTORS: dict[str, Executor] = {"inline": _inline, "pool": _pool, "ray": run_on_ray}


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
