"""Flags shared by ``tokenomy sim`` and ``tokenomy sim compare``, turned into an ExperimentSpec.

Every experiment flag defaults to None in argparse, so :func:`spec_from_args` can tell a flag
the user gave from one left alone: with ``--spec FILE`` the file is the experiment and the
flags given on the command line override its fields. The defaults shown in ``--help`` are the
spec's own (``tokenomy.experiment.spec``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenomy.core import SLO
from tokenomy.experiment import (
    ClusterSpec,
    DeploymentSpec,
    ExperimentSpec,
    WorkloadSpec,
    load_spec,
    parse_split,
)
from tokenomy.policy.closedloop import ADMISSION_POLICIES
from tokenomy.sim.variants import VARIANTS
from tokenomy.workload import FORMATS, SYNTHETIC

_W, _C, _S = WorkloadSpec(), ClusterSpec(), SLO()


def _int_at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _positive_int() -> Any:
    return _int_at_least(1)


def _nonnegative_int() -> Any:
    return _int_at_least(0)


def _number(minimum: float = 0.0, strict: bool = False) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
        if not ok:
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum:g}, "
                                             f"got {text}")
        return value

    return parse


def add_experiment_args(p: argparse.ArgumentParser, *, default_deployments: str) -> None:
    """Workload, cluster, SLO and deployment flags, and ``--spec``."""
    p.add_argument("--spec", type=Path, default=None, metavar="FILE",
                   help="run a saved experiment (YAML, or a result JSON that embeds one); flags given "
                        "here override its fields")
    p.add_argument("--save-spec", type=Path, default=None, metavar="FILE",
                   help="write the experiment as YAML (rerun it with --spec)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default=None, metavar="SPEC",
                   help=f"{' | '.join(SYNTHETIC)} | path to a trace or session file, optionally as FORMAT:path "
                        f"(default: {_W.source})")
    g.add_argument("--format", default=None, choices=list(FORMATS),
                   help="file format (default: by extension and first line; the guess is printed)")
    g.add_argument("--rate", type=_number(), default=None,
                   help="session arrivals per second (default: 1 for synthetic workloads; files replay on "
                        "their own clock; given, a file is rescaled to it, 0 keeps its clock)")
    g.add_argument("--duration", type=_number(strict=True), default=None,
                   help="seconds of arrivals (default: 120 for synthetic workloads; files whole; given, "
                        "sessions of a file starting later are dropped)")
    g.add_argument("--arrival", default=None, help=f"poisson | gamma, synthetic workloads (default: {_W.arrival})")
    g.add_argument("--arrival-cv", type=_number(strict=True), default=None,
                   help=f"coefficient of variation of gamma arrivals (default: {_W.arrival_cv:g})")
    g.add_argument("--max-sessions", type=_positive_int(), default=None,
                   help="keep the first N sessions by start time (default: all)")
    g.add_argument("--seed", type=int, default=None, help=f"random seed (default: {_W.seed})")
    g.add_argument("--tenants", default=None, metavar="MIX",
                   help="give sessions without a tenant one drawn from a tier mix, e.g. "
                        "gold:0.2,silver:0.3,free:0.5 (TIER:SHARE[:TENANTS]; default: none)")
    c = p.add_argument_group("cluster")
    c.add_argument("--model", default=None,
                   help=f"catalog name or path to a Hugging Face config.json (default: {_C.model})")
    c.add_argument("--gpu", default=None, help=f"catalog name or path to a GPU YAML/JSON (default: {_C.gpu})")
    c.add_argument("--tp", type=_positive_int(), default=None, help=f"GPUs per instance (default: {_C.tp})")
    c.add_argument("--instances", type=_positive_int(), default=None,
                   help=f"instances per deployment, colocated or P + D (default: {_C.instances})")
    c.add_argument("--prefill", type=_positive_int(), default=None,
                   help="prefill instances of disaggregated deployments (default: half of --instances)")
    c.add_argument("--decode", type=_positive_int(), default=None,
                   help="decode instances (default: --instances minus --prefill)")
    c.add_argument("--gpus", default=None, metavar="INVENTORY",
                   help="a mixed GPU inventory, NAME:COUNT[@tpN],... e.g. h100:4,h20:8 (sets --instances; "
                        "colocated runs each type as mixed instances, disaggregated ones prefill on the "
                        "compute-rich type)")
    c.add_argument("--gpus-per-node", type=_positive_int(), default=None,
                   help="instances fill nodes of this many GPUs: KV moves over NVLink inside a node, over "
                        "RDMA NICs across (default: every instance its own node)")
    c.add_argument("--kv-transfer-timeout", type=_number(strict=True), default=None, metavar="S",
                   help="a KV transfer still in flight after S seconds is cut; its request is incomplete")
    c.add_argument("--router", default=None, help=f"router of the (prefill) instances (default: {_C.router})")
    c.add_argument("--max-num-batched-tokens", type=_positive_int(), default=None,
                   help=f"engine token budget per step (default: {_C.max_num_batched_tokens})")
    c.add_argument("--max-num-seqs", type=_positive_int(), default=None,
                   help=f"engine batch limit (default: {_C.max_num_seqs})")
    c.add_argument("--calibration", default=None, metavar="FILE",
                   help="a `tokenomy perf profile` file: price steps with the measured engine's fitted model and "
                        "run its limits (block size, KV blocks, token budget, batch limit) (default: none)")
    c.add_argument("--horizon", type=_number(strict=True), default=None,
                   help="stop the clock here; unfinished requests miss the SLO (default: run until drained)")
    c.add_argument("--admission", default=None, metavar="POLICY",
                   help=f"closed-loop admission in front of the cluster: {' | '.join(ADMISSION_POLICIES)} "
                        "(default: none, every request goes straight in)")
    c.add_argument("--max-in-flight", type=_positive_int(), default=None,
                   help=f"with --admission: requests admitted at once, cluster-wide (default: {_C.max_in_flight})")
    c.add_argument("--max-retries", type=_nonnegative_int(), default=None, metavar="N",
                   help="with --admission: a refused turn is sent again after its retry-after up to N times, "
                        f"then its session is abandoned, as `tokenomy bench` does (default: {_C.max_retries})")
    c.add_argument("--plan", type=Path, default=None,
                   help="a plan file from `tokenomy plan --out`: its topology replaces the cluster and "
                   "deployment flags (default: none)")
    s = p.add_argument_group("SLO")
    s.add_argument("--slo-ttft", type=_number(strict=True), default=None,
                   help=f"TTFT bound, seconds (default: {_S.ttft_s:g})")
    s.add_argument("--slo-tpot", type=_number(strict=True), default=None,
                   help=f"TPOT bound, seconds, vLLM's definition (default: {_S.tpot_s:g})")
    d = p.add_argument_group("deployments")
    d.add_argument("--deployments", "--deployment", dest="deployments", default=None, metavar="NAMES",
                   help=f"comma-separated NAME or NAME@P:D (P + D = --instances) of: {', '.join(VARIANTS)} "
                        f"(default: {default_deployments})")
    d.add_argument("--splits", default=None,
                   help="P:D of disaggregated deployments without @P:D: fixed (--prefill/--decode) | auto "
                        "(every P + D = --instances, best reported) | a list like 1:7,2:6 (default: fixed)")
    p.set_defaults(default_deployments=default_deployments)


def _deployments(text: str) -> tuple[DeploymentSpec, ...]:
    labels = [t.strip() for t in text.split(",") if t.strip()]
    if not labels:
        raise ValueError(f"--deployments needs at least one name of: {', '.join(VARIANTS)}")
    return tuple(DeploymentSpec.parse(label) for label in labels)


def _splits(text: str) -> str | tuple[tuple[int, int], ...]:
    if text in ("fixed", "auto"):
        return text
    return tuple(parse_split(s.strip(), f"--splits {text}") for s in text.split(",") if s.strip())


def parse_rates(text: str) -> tuple[float, ...]:
    """``--rates``: comma-separated positive numbers, sorted."""
    try:
        rates = sorted({float(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise ValueError(f"--rates must be comma-separated numbers, got {text!r}") from None
    if not rates or not all(0 < r < math.inf for r in rates):
        raise ValueError(f"--rates needs finite numbers > 0, got {text!r}")
    return tuple(rates)


def _given(args: argparse.Namespace, pairs: dict[str, str]) -> dict[str, Any]:
    return {field: getattr(args, flag) for flag, field in pairs.items() if getattr(args, flag, None) is not None}


def _apply_plan(path: Path, spec: ExperimentSpec) -> ExperimentSpec:
    """``spec`` running the topology of the plan file at ``path`` (one deployment at its own split)."""
    from tokenomy.plan.planfile import deployment_label, sim_overrides

    o = sim_overrides(path)
    shape = {k: o[k] for k in ("model", "gpu", "tp", "instances", "prefill_tp", "decode_tp", "prefill_gpu",
                               "decode_gpu") if k in o}
    return replace(spec, cluster=replace(spec.cluster, **shape), fixed_split=None, splits="fixed",
                   deployments=_deployments(deployment_label(path)))


def spec_from_args(args: argparse.Namespace) -> ExperimentSpec:
    """The experiment the flags (and ``--spec``) describe. Raises ValueError naming the flag at fault."""
    base = load_spec(args.spec) if args.spec else ExperimentSpec(
        deployments=_deployments(args.default_deployments))
    workload = replace(base.workload, **_given(args, {
        "workload": "source", "format": "format", "rate": "rate_per_s", "duration": "duration_s",
        "arrival": "arrival", "arrival_cv": "arrival_cv", "max_sessions": "max_sessions", "seed": "seed",
        "tenants": "tenants"}))
    cluster = replace(base.cluster, **_given(args, {
        "model": "model", "gpu": "gpu", "tp": "tp", "instances": "instances", "router": "router",
        "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
        "horizon": "horizon_s", "admission": "admission", "max_in_flight": "max_in_flight", "max_retries": "max_retries",
        "gpus": "gpus", "gpus_per_node": "gpus_per_node", "kv_transfer_timeout": "kv_transfer_timeout_s",
        "calibration": "calibration"}))
    slo = replace(base.slo, **_given(args, {"slo_ttft": "ttft_s", "slo_tpot": "tpot_s"}))
    fixed = base.fixed_split
    if args.prefill is not None or args.decode is not None:
        n = cluster.instances
        prefill = args.prefill if args.prefill is not None else n - args.decode
        decode = args.decode if args.decode is not None else n - prefill
        if prefill < 1 or decode < 1 or prefill + decode != n:
            raise ValueError(f"--prefill {prefill} + --decode {decode} must be {n} (--instances), both >= 1: "
                             "every deployment runs on the same GPUs")
        fixed = (prefill, decode)
    rates = parse_rates(args.rates) if getattr(args, "rates", None) is not None else base.rates
    if getattr(args, "plan", None) is not None:
        return _apply_plan(args.plan, replace(base, workload=workload, cluster=cluster, slo=slo, rates=rates))
    return replace(
        base, workload=workload, cluster=cluster, slo=slo, fixed_split=fixed, rates=rates,
        deployments=_deployments(args.deployments) if args.deployments is not None else base.deployments,
        splits=_splits(args.splits) if args.splits is not None else base.splits,
    )
