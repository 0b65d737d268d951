"""The experiment spec: everything that made a run, as typed data (YAML in, JSON out).

An :class:`ExperimentSpec` names a workload, a cluster, the deployments to compare (each a
registered variant with an optional pinned ``P:D`` split and router), the SLO, the session
rates to sweep and how disaggregated deployments pick their split. ``tokenomy sim`` and
``tokenomy sim compare`` build one from their flags (``--spec FILE`` loads a saved one), the
sweep runner (:mod:`tokenomy.experiment.sweep`) runs it, and every JSON result embeds
``spec.to_dict()``, so a result says how it was made and can be rerun.

Invariants checked on construction (ValueError, one line): positive rates, an SLO with
positive bounds, known deployment names, and for disaggregated deployments ``P + D`` equal to
``cluster.instances``: a split never changes the GPU count, so every deployment of one
experiment runs on the same GPUs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tokenomy.core import SLO
from tokenomy.experiment.splits import Split, parse_split
from tokenomy.metrics.goodput import DEFAULT_ATTAINMENT_TARGET
from tokenomy.perf.inventory import GpuPool, format_gpus, parse_gpus, role_pools
from tokenomy.policy.closedloop import ADMISSION_POLICIES, RetryPolicy
from tokenomy.sim.admission_options import AdmissionOptions
from tokenomy.sim.config import SimConfig
from tokenomy.sim.variants import VARIANTS, is_disaggregated, make_variant, runs_without_prefill
from tokenomy.workload.tenants import TenantMix

SPLIT_MODES = ("fixed", "auto")


@dataclass(frozen=True)
class WorkloadSpec:
    """Where sessions come from: see :func:`tokenomy.workload.load_workload` for ``source``.

    ``rate_per_s``/``duration_s`` None: synthetic workloads use 1 session/s over 120 s, trace
    and session files replay on their own clock, whole. Given, they rescale and cut traces too.
    """

    source: str = "gaia"
    format: str | None = None
    rate_per_s: float | None = None
    duration_s: float | None = None
    arrival: str = "poisson"
    arrival_cv: float = 1.0
    max_sessions: int | None = None
    seed: int = 0
    tenants: str | None = None  # a tenant mix, e.g. "gold:0.2,silver:0.3,free:0.5" (workload/tenants.py)

    def __post_init__(self) -> None:
        if self.tenants is not None:
            TenantMix.parse(self.tenants)  # raises ValueError naming the bad entry
        if self.rate_per_s is not None and not (0 <= self.rate_per_s < math.inf):
            raise ValueError(f"workload rate_per_s must be a finite number >= 0, got {self.rate_per_s}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"workload duration_s must be > 0, got {self.duration_s}")
        if not (0 < self.arrival_cv < math.inf):
            raise ValueError(f"workload arrival_cv must be a finite number > 0, got {self.arrival_cv}")
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError(f"workload max_sessions must be >= 1, got {self.max_sessions}")


@dataclass(frozen=True)
class ClusterSpec:
    """One model on GPUs of one kind; ``model``/``gpu`` are catalog names or file paths."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    instances: int = 8
    router: str = "prefix_aware"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    horizon_s: float | None = None
    # The closed loop's front door (sim/admission_gate.py): a policy of ADMISSION_POLICIES, or None.
    admission: str | None = None
    max_in_flight: int = 64
    max_retries: int = RetryPolicy.max_retries  # how often a simulated client resends a refused turn
    # A disaggregated deployment's roles may have their own shape (a planner's heterogeneous pools,
    # `tokenomy plan`); None: ``tp`` and ``gpu``.
    prefill_tp: int | None = None
    decode_tp: int | None = None
    prefill_gpu: str | None = None
    decode_gpu: str | None = None
    # A mixed GPU inventory, ``h100:4,h20:8`` (tokenomy.perf.inventory): it sets ``instances``, and
    # ``gpu``/``tp`` to its first pool's; disaggregated deployments prefill on the compute-rich type.
    gpus: str | None = None
    gpus_per_node: int | None = None  # KV over NVLink inside a node, RDMA across (None: every instance a node)
    kv_transfer_timeout_s: float | None = None  # a KV transfer cut after this long leaves its request incomplete
    # A `tokenomy perf profile` file: steps and engine limits of a measured engine (docs/simulator.md).
    calibration: str | None = None

    def __post_init__(self) -> None:
        if self.gpus is not None:
            pools = parse_gpus(self.gpus, self.tp)
            object.__setattr__(self, "gpus", format_gpus(pools))
            object.__setattr__(self, "instances", sum(p.instances for p in pools))
            object.__setattr__(self, "gpu", pools[0].gpu)
            object.__setattr__(self, "tp", pools[0].tp)
            if any(getattr(self, k) is not None for k in ("prefill_tp", "decode_tp", "prefill_gpu", "decode_gpu")):
                raise ValueError("cluster gpus sets each role's GPU and TP: drop prefill_/decode_ gpu and tp")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"cluster gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.kv_transfer_timeout_s is not None and not self.kv_transfer_timeout_s > 0:
            raise ValueError(f"cluster kv_transfer_timeout_s must be > 0, got {self.kv_transfer_timeout_s}")
        for name in ("prefill_tp", "decode_tp"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"cluster {name} must be >= 1, got {v}")
        if self.admission is not None:
            ADMISSION_POLICIES.get(self.admission)  # raises ValueError naming the known ones
        for name in ("tp", "instances", "max_num_batched_tokens", "max_num_seqs", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"cluster {name} must be >= 1, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ValueError(f"cluster max_retries must be >= 0, got {self.max_retries}")
        if self.horizon_s is not None and not self.horizon_s > 0:
            raise ValueError(f"cluster horizon_s must be > 0, got {self.horizon_s}")


@dataclass(frozen=True)
class DeploymentSpec:
    """A registered variant (``sim.variants``), optionally with its own split and router."""

    name: str
    split: Split | None = None
    router: str | None = None

    @classmethod
    def parse(cls, label: str) -> DeploymentSpec:
        """``name`` or ``name@P:D``."""
        name, _, split = label.strip().partition("@")
        return cls(name, parse_split(split, label) if split else None)

    @property
    def label(self) -> str:
        return f"{self.name}@{self.split[0]}:{self.split[1]}" if self.split else self.name

    @property
    def disaggregated(self) -> bool:
        return is_disaggregated(self.name)

    def __post_init__(self) -> None:
        if self.name not in VARIANTS:
            raise ValueError(f"unknown deployment {self.name!r}; known: {', '.join(VARIANTS)}")
        if self.split is not None and not self.disaggregated:
            raise ValueError(f"deployment {self.name!r} is not disaggregated: it takes no P:D split")
        if self.split is not None and self.split[0] == 0 and not runs_without_prefill(self.name):
            raise ValueError(f"bad split {self.label!r}: {self.name} needs >= 1 prefill instance "
                             "(only AMPD runs with none: every prefill local on the session's decode instance)")


@dataclass(frozen=True)
class ExperimentSpec:
    """A whole experiment. ``rates`` None: one run at the workload's own rate (``tokenomy sim``).

    ``splits``: ``"fixed"`` (each disaggregated deployment runs ``fixed_split``, default half
    and half), ``"auto"`` (every ``P:D`` with ``P + D = instances``; the best by
    ``max_rate_at_target`` then mean attainment is reported) or a list of splits (best of those).
    """

    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    deployments: tuple[DeploymentSpec, ...] = (DeploymentSpec("colocated"), DeploymentSpec("disagg"))
    slo: SLO = field(default_factory=SLO)
    rates: tuple[float, ...] | None = None
    splits: str | tuple[Split, ...] = "fixed"
    fixed_split: Split | None = None
    attainment_target: float = DEFAULT_ATTAINMENT_TARGET

    def __post_init__(self) -> None:
        if not self.deployments:
            raise ValueError("an experiment needs at least one deployment")
        labels = [d.label for d in self.deployments]
        if len(set(labels)) != len(labels):
            raise ValueError(f"deployments repeat a name: {', '.join(labels)}")
        if self.rates is not None:
            if not self.rates or not all(0 < r < math.inf for r in self.rates):
                raise ValueError(f"rates must be finite numbers > 0, got {list(self.rates)}")
            if len(set(self.rates)) != len(self.rates):
                raise ValueError(f"rates repeat a value: {list(self.rates)}")
        if not 0 < self.attainment_target <= 1:
            raise ValueError(f"attainment_target must lie in (0, 1], got {self.attainment_target}")
        if isinstance(self.splits, str) and self.splits not in SPLIT_MODES:
            raise ValueError(f"splits must be {' | '.join(SPLIT_MODES)} or a list of P:D, got {self.splits!r}")
        n = self.cluster.instances
        mixed = self.mixed_split
        if mixed is not None:
            for dep in self.deployments:
                if dep.split is not None and not 0 <= dep.split[0] <= mixed[0]:
                    raise ValueError(f"{dep.label}: on the mixed inventory {self.cluster.gpus} the prefill "
                                     f"instances are 1 to {mixed[0]} of the compute-rich type (0 for AMPD; its "
                                     f"others decode beside the {mixed[1]} of the other type), got {dep.split[0]}")
        pinned = [(d.label, d.split) for d in self.deployments if d.split]
        listed = [] if isinstance(self.splits, str) else [(f"splits {p}:{d}", (p, d)) for p, d in self.splits]
        fixed = [("fixed split", self.fixed_split)] if self.fixed_split else []
        for where, (p, d) in [*pinned, *listed, *fixed]:
            if p + d != n:
                raise ValueError(f"{where}: {p}P + {d}D = {p + d} instances, but the cluster has {n} "
                                 "(a split never changes the GPU count)")
        pd_only = [d.name for d in self.deployments if d.disaggregated and not d.split and not runs_without_prefill(d.name)]
        for where, (p, _) in [*listed, *fixed]:
            if p == 0 and pd_only:
                raise ValueError(f"{where}: {', '.join(pd_only)} need >= 1 prefill instance (only AMPD runs "
                                 "with none); pin the AMPD deployment's split instead, e.g. ampd@0:8")
        if self.splits == "auto" and n < 2 and any(d.disaggregated and not d.split for d in self.deployments):
            raise ValueError(f"splits auto needs at least 2 instances for a disaggregated deployment, got {n}")
        if self.fixed_split is None and n < 2 and any(d.disaggregated for d in self.deployments):
            raise ValueError(f"a disaggregated deployment needs at least 2 instances (1 prefill, 1 decode), got {n}")

    def splits_of(self, dep: DeploymentSpec) -> list[Split | None]:
        """The splits ``dep`` runs: ``[None]`` for a colocated deployment."""
        if not dep.disaggregated:
            return [None]
        mixed = self.mixed_split
        if mixed is not None:  # a mixed inventory: its types are the roles (a pinned split: fewer prefill)
            return [dep.split or mixed]
        if dep.split is not None:
            return [dep.split]
        n = self.cluster.instances
        if self.splits == "auto":  # AMPD also without a prefill instance
            return [(p, n - p) for p in range(0 if runs_without_prefill(dep.name) else 1, n)]
        if not isinstance(self.splits, str):
            return list(self.splits)
        return [self.fixed_split or (max(1, n // 2), n - max(1, n // 2))]

    @property
    def mixed_split(self) -> Split | None:
        """The split a mixed inventory of two types gives disaggregated deployments (None: one type)."""
        pools = self.pools
        if len(pools) < 2:
            return None
        prefill, decode = role_pools(pools)
        return prefill.instances, decode.instances

    @property
    def pools(self) -> tuple[GpuPool, ...]:
        c = self.cluster
        return parse_gpus(c.gpus, c.tp) if c.gpus else (GpuPool(c.gpu, c.instances * c.tp, c.tp),)

    def sim_config(self, dep: DeploymentSpec, split: Split | None) -> SimConfig:
        """The simulator's config for one deployment at one split."""
        c = self.cluster
        prefill, decode = split or (max(1, c.instances // 2), max(1, c.instances - c.instances // 2))
        base = SimConfig(
            deployment="ampd" if prefill == 0 else "colocated",  # the variant sets it (only AMPD runs 0:D)
            model=c.model, gpu=c.gpu, tp=c.tp, instances=c.instances, prefill=prefill, decode=decode,
            router=c.router, max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
            horizon_s=c.horizon_s, calibration=c.calibration,
            admission=(AdmissionOptions(c.admission, c.max_in_flight, retry=RetryPolicy(max_retries=c.max_retries))
                       if c.admission is not None else None),
        )
        base = replace(base, gpus_per_node=c.gpus_per_node, kv_transfer_timeout_s=c.kv_transfer_timeout_s)
        config = make_variant(dep.name, base)
        shapes = {k: getattr(c, k) for k in ("prefill_tp", "decode_tp", "prefill_gpu", "decode_gpu")
                  if getattr(c, k) is not None}
        pools = self.pools
        if len(pools) > 1 and config.deployment == "colocated":
            config = replace(config, mixed_pools=tuple((p.gpu, p.tp, p.instances) for p in pools))
        elif len(pools) > 1:
            pre, dec = role_pools(pools)
            p = split[0] if split else pre.instances  # the compute-rich type's others decode
            config = replace(config, gpu=pre.gpu, tp=pre.tp, prefill=p, decode=dec.instances,
                             prefill_type_decodes=pre.instances - p)
            shapes = {"prefill_gpu": pre.gpu, "prefill_tp": pre.tp, "decode_gpu": dec.gpu, "decode_tp": dec.tp}
        if shapes:  # after the variant: SimConfig refuses role shapes on a non-disaggregated deployment
            config = replace(config, **shapes)
        return replace(config, router=dep.router) if dep.router else config

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-able form; :func:`spec_from_dict` reads it back to an equal spec."""
        return {
            "workload": asdict(self.workload),
            "cluster": asdict(self.cluster),
            "deployments": [_dep_dict(d) for d in self.deployments],
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s},
            "rates": list(self.rates) if self.rates is not None else None,
            "splits": self.splits if isinstance(self.splits, str) else [f"{p}:{d}" for p, d in self.splits],
            "fixed_split": f"{self.fixed_split[0]}:{self.fixed_split[1]}" if self.fixed_split else None,
            "attainment_target": self.attainment_target,
        }


def _dep_dict(d: DeploymentSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": d.name}
    if d.split:
        out["split"] = f"{d.split[0]}:{d.split[1]}"
    if d.router:
        out["router"] = d.router
    return out


def _section(raw: Any, cls: type, where: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _deployment(raw: Any, where: str) -> DeploymentSpec:
    if isinstance(raw, str):
        return DeploymentSpec.parse(raw)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ValueError(f"{where}: a deployment is a name (e.g. ampd@2:6) or a mapping with a name")
    unknown = sorted(set(raw) - {"name", "split", "router"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: name, router, split")
    split = parse_split(str(raw["split"]), where) if raw.get("split") is not None else None
    return DeploymentSpec(raw["name"], split, raw.get("router"))


def spec_from_dict(raw: Any, where: str = "spec") -> ExperimentSpec:
    """Validate a plain mapping (from YAML or JSON) into a spec; ValueError naming the key at fault."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping at the top level")
    top = {"workload", "cluster", "deployments", "slo", "rates", "splits", "fixed_split", "attainment_target"}
    unknown = sorted(set(map(str, raw)) - top)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(top))}")
    deps_raw = raw.get("deployments", ["colocated", "disagg"])
    if not isinstance(deps_raw, list):
        raise ValueError(f"{where}: deployments must be a list")
    rates = raw.get("rates")
    if rates is not None and (not isinstance(rates, list) or not all(_is_number(r) for r in rates)):
        raise ValueError(f"{where}: rates must be a list of numbers")
    splits = raw.get("splits", "fixed")
    if isinstance(splits, list):
        splits = tuple(parse_split(str(s), f"{where}: splits") for s in splits)
    elif not isinstance(splits, str):
        raise ValueError(f"{where}: splits must be fixed, auto or a list of P:D")
    fixed = raw.get("fixed_split")
    try:
        return ExperimentSpec(
            workload=_section(raw.get("workload"), WorkloadSpec, f"{where}: workload"),
            cluster=_section(raw.get("cluster"), ClusterSpec, f"{where}: cluster"),
            deployments=tuple(_deployment(d, f"{where}: deployments[{i}]") for i, d in enumerate(deps_raw)),
            slo=_section(raw.get("slo"), SLO, f"{where}: slo"),
            rates=tuple(float(r) for r in rates) if rates is not None else None,
            splits=splits,
            fixed_split=parse_split(str(fixed), f"{where}: fixed_split") if fixed is not None else None,
            attainment_target=float(raw.get("attainment_target", DEFAULT_ATTAINMENT_TARGET)),
        )
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read a YAML (or JSON, a subset) spec file; a result JSON's ``"spec"`` key is accepted too."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--spec {p}: cannot read ({exc.__class__.__name__})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ValueError(f"--spec {p}{line}: not valid YAML ({getattr(exc, 'problem', None) or 'syntax'})") from None
    if isinstance(raw, dict) and "spec" in raw and "workload" not in raw:
        raw = raw["spec"]
    return spec_from_dict(raw, where=f"--spec {p}")


def dump_spec(spec: ExperimentSpec, path: str | Path) -> Path:
    """Write ``spec`` as YAML that :func:`load_spec` reads back."""
    import yaml

    target = Path(path)
    target.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False), encoding="utf-8")
    return target
