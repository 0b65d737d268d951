"""Typed results of experiments, and their JSON forms (schemas in docs/json-schemas.md).

:class:`RunResult` is one simulation (one deployment, one split, one rate).
:class:`Curve` is one deployment's runs over the swept rates at one split, with the highest
rate at which SLO attainment stays at the target (DistServe's goodput, ``max_rate_at_target``).
:class:`SweepResult` is a whole ``sim compare``: the best split's curve per deployment, every
split tried, and the spec that made it. ``SweepResult.from_dict(json.load(f))`` reads a
written result back, so scripts (``benchmarks/ampd_gains.py``) use attributes, not dict keys.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tokenomy.experiment.spec import ExperimentSpec, spec_from_dict
from tokenomy.experiment.splits import Split
from tokenomy.metrics import Summary, max_rate_at_attainment

SIM_SCHEMA = "tokenomy.sim/2"
COMPARE_SCHEMA = "tokenomy.sim-compare/2"


@dataclass(frozen=True)
class RunResult:
    """One simulation. ``rate_per_s`` None: the workload's own rate (a trace's clock)."""

    deployment: str
    split: Split | None
    rate_per_s: float | None
    summary: Summary
    num_gpus: int
    sim_end_s: float
    wall_s: float
    kv_transfers: dict[str, Any] | None = None  # SimResult.transfers.to_dict(): waits, bytes, timeouts

    def to_dict(self) -> dict[str, Any]:
        d = self.summary.to_dict()
        d.update(num_gpus=self.num_gpus, sim_end_s=self.sim_end_s, wall_s=round(self.wall_s, 3),
                 split=_split_dict(self.split), rate_per_s=self.rate_per_s)
        if self.kv_transfers is not None:
            d["kv_transfers"] = self.kv_transfers
        return d


def _split_dict(split: Split | None) -> dict[str, int] | None:
    return {"prefill": split[0], "decode": split[1]} if split else None


def _split_of(d: dict[str, Any] | None) -> Split | None:
    return (int(d["prefill"]), int(d["decode"])) if d else None


_SERIES = ("slo_attainment", "goodput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
           "e2e_p99_s", "rejected", "cost_per_mtok_usd", "cost_per_mtok_output_usd", "mfu")
"""Summary fields a curve lists per rate in its JSON form."""


@dataclass(frozen=True)
class Curve:
    """One deployment at one split over the swept rates (``runs[i]`` at ``rates[i]``)."""

    deployment: str
    split: Split | None
    rates: tuple[float, ...]
    runs: tuple[RunResult, ...]
    attainment_target: float

    @property
    def attainment(self) -> list[float]:
        return [r.summary.slo_attainment for r in self.runs]

    @property
    def max_rate_at_target(self) -> float:
        """Highest session rate with attainment >= the target (interpolated; see metrics.goodput)."""
        return max_rate_at_attainment(self.rates, self.attainment, self.attainment_target)

    def score(self) -> tuple[float, float]:
        """Order of splits: max rate at target, then mean attainment."""
        att = self.attainment
        return self.max_rate_at_target, sum(att) / len(att)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "split": _split_dict(self.split),
            "num_gpus": self.runs[0].num_gpus,
            "attainment_target": self.attainment_target,
            "max_rate_at_target_rps": self.max_rate_at_target,
        }
        for key in _SERIES:
            out[key] = [r.summary.to_dict()[key] for r in self.runs]
        out["runs"] = [r.to_dict() for r in self.runs]
        return out

    @classmethod
    def from_dict(cls, name: str, rates: list[float], d: dict[str, Any]) -> Curve:
        known = {f.name for f in fields(Summary)}
        runs = tuple(
            RunResult(name, _split_of(r.get("split")), r.get("rate_per_s"),
                      Summary(**{k: v for k, v in r.items() if k in known}), int(r["num_gpus"]),
                      float(r["sim_end_s"]), float(r["wall_s"]))
            for r in d["runs"]
        )
        return cls(name, _split_of(d.get("split")), tuple(rates), runs, float(d["attainment_target"]))


@dataclass(frozen=True)
class SweepResult:
    """A ``sim compare``: per deployment label, the best split's curve, and every split tried."""

    spec: ExperimentSpec
    best: dict[str, Curve]
    tried: dict[str, tuple[Curve, ...]]
    workload: dict[str, Any]

    @property
    def rates(self) -> tuple[float, ...]:
        return self.spec.rates or ()

    def to_dict(self) -> dict[str, Any]:
        deployments = {}
        for label, curve in self.best.items():
            d = curve.to_dict()
            d["splits_tried"] = [
                {"split": _split_dict(c.split), "max_rate_at_target_rps": c.max_rate_at_target,
                 "mean_attainment": c.score()[1]}
                for c in self.tried[label]
            ]
            deployments[label] = d
        return {"schema": COMPARE_SCHEMA, "spec": self.spec.to_dict(), "rates": list(self.rates),
                "workload": self.workload, "deployments": deployments}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepResult:
        """Read a written ``sim compare`` JSON back (ValueError if it is another schema)."""
        if d.get("schema") != COMPARE_SCHEMA:
            raise ValueError(f"not a {COMPARE_SCHEMA} result (schema {d.get('schema')!r})")
        spec = spec_from_dict(d["spec"], "result spec")
        rates = [float(r) for r in d["rates"]]
        best = {name: Curve.from_dict(name, rates, c) for name, c in d["deployments"].items()}
        return cls(spec, best, {n: (c,) for n, c in best.items()}, dict(d.get("workload") or {}))


def sim_payload(spec: ExperimentSpec, runs: list[RunResult], workload: dict[str, Any]) -> dict[str, Any]:
    """JSON form of a ``tokenomy sim`` run: the spec, the workload that ran, one entry per deployment."""
    return {
        "schema": SIM_SCHEMA,
        "spec": spec.to_dict(),
        "workload": workload,
        "slo": {"ttft_s": spec.slo.ttft_s, "tpot_s": spec.slo.tpot_s},
        "deployments": {r.deployment: r.to_dict() for r in runs},
    }
