"""Which deployment to run: AMPD, PD disaggregation or colocated, with or without the host KV tier.

The planner's MILP (:mod:`tokenomy.plan`) sizes pools from a queueing model; it cannot see
what separates these deployments (KV memory across tool calls, prefill/decode interference,
history shipped between instances, link queueing). So the choice is made the way a careful
operator would make it: simulate each candidate on the same GPUs at the rate to serve, on an
independent sample of the workload (another seed than the one the caller reports on), and
take the one with the most SLO-meeting requests per second; ties go to the one listed first
(simpler deployments are listed after AMPD only where they lose). The answer says why, in
numbers: the winner's attainment and tails beside each other candidate's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tokenomy.experiment.results import RunResult
from tokenomy.experiment.spec import DeploymentSpec, ExperimentSpec, Split
from tokenomy.experiment.sweep import Job, run_jobs

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

    @property
    def label(self) -> str:
        return f"{self.deployment}@{self.split[0]}:{self.split[1]}" if self.split else self.deployment

    @property
    def predicted_goodput_rps(self) -> float:
        return self._chosen.summary.goodput_rps

    @property
    def _chosen(self) -> RunResult:
        return next(r for r in self.results if r.deployment == self.deployment and r.split == self.split)

    def to_dict(self) -> dict[str, object]:
        return {
            "deployment": self.deployment,
            "label": self.label,
            "split": list(self.split) if self.split else None,
            "rate_per_s": self.rate_per_s,
            "predicted_goodput_rps": self.predicted_goodput_rps,
            "why": self.why,
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
    candidates: Sequence[str] = CANDIDATES,
    seed_offset: int = 1,
    duration_s: float | None = None,
    workers: int = 1,
) -> Choice:
    """Simulate every candidate (at each of its splits in ``spec``) at ``rate_per_s`` on a sample
    of the workload drawn with ``spec.workload.seed + seed_offset`` (and ``duration_s`` if given),
    and choose the one with the highest goodput (then attainment, then the lowest P99 TTFT)."""
    if not rate_per_s > 0:
        raise ValueError(f"the planning rate must be > 0, got {rate_per_s}")
    workload = replace(spec.workload, seed=spec.workload.seed + seed_offset,
                       duration_s=duration_s if duration_s is not None else spec.workload.duration_s)
    deployments = tuple(DeploymentSpec(name) for name in candidates)
    sample = replace(spec, workload=workload, deployments=deployments, rates=(rate_per_s,))
    jobs = [Job(d, split, rate_per_s) for d in deployments for split in sample.splits_of(d)]
    done = run_jobs(sample, jobs, executor="pool", workers=workers)
    results = tuple(done[j] for j in jobs)
    order = {id(r): i for i, r in enumerate(results)}

    def key(r: RunResult) -> tuple[float, float, float, int]:
        s = r.summary
        return (-s.goodput_rps, -s.slo_attainment, s.ttft_p99_s if s.ttft_p99_s is not None else float("inf"),
                order[id(r)])

    ranked = sorted(results, key=key)
    best = ranked[0]
    name = best.deployment.partition("@")[0]
    return Choice(name, best.split, rate_per_s, results, _why(best, ranked[1:], spec))


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
    parts = [f"{_label(best)}: {best.summary.goodput_rps:.3g} SLO-meeting requests/s ({_tails(best)})"]
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
        ratio = best.summary.goodput_rps / s.goodput_rps if s.goodput_rps > 0 else float("inf")
        parts.append(f"{_label(r)}: {s.goodput_rps:.3g}/s ({_tails(r)}{bound}; the choice serves {ratio:.2f}x)")
    return "; ".join(parts)
