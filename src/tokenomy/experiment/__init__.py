"""Experiments as data: a typed, YAML-loadable spec and a sweep runner with typed results.

``tokenomy sim`` and ``tokenomy sim compare`` build an :class:`ExperimentSpec` from their flags
(or load one with ``--spec``) and call :func:`run_jobs` / :func:`run_sweep`; the JSON they write
embeds ``spec.to_dict()``. See docs/experiments.md.
"""

from tokenomy.experiment.jobs import Job, load_sessions, plan_jobs, run_job
from tokenomy.experiment.results import Curve, RunResult, SweepResult, sim_payload
from tokenomy.experiment.spec import (
    ClusterSpec,
    DeploymentSpec,
    ExperimentSpec,
    WorkloadSpec,
    dump_spec,
    load_spec,
    spec_from_dict,
)
from tokenomy.experiment.splits import parse_split
from tokenomy.experiment.sweep import EXECUTORS, Progress, run_jobs, run_sweep

__all__ = [
    "EXECUTORS",
    "ClusterSpec",
    "Curve",
    "DeploymentSpec",
    "ExperimentSpec",
    "Job",
    "Progress",
    "RunResult",
    "SweepResult",
    "WorkloadSpec",
    "dump_spec",
    "load_sessions",
    "load_spec",
    "parse_split",
    "plan_jobs",
    "run_job",
    "run_jobs",
    "run_sweep",
    "sim_payload",
    "spec_from_dict",
]
