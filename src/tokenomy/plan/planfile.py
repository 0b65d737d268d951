"""A plan as a YAML file, and the simulator arguments it stands for.

The file records the topology (one pool per role: GPU type, TP, count), the inputs it was
planned for and the predictions, so that ``tokenomy sim --plan FILE`` and ``tokenomy sim
compare --plan FILE`` run exactly that deployment (:func:`sim_overrides`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tokenomy.plan.planner import Plan
from tokenomy.plan.queueing import Prediction

FORMAT_VERSION = 1


def _prediction(p: Prediction) -> dict[str, Any]:
    out: dict[str, Any] = {"utilization": round(p.utilization, 4), "kv_utilization": round(p.kv_utilization, 4)}
    if p.ttft_p95_s is not None:
        out["ttft_p95_s"] = round(p.ttft_p95_s, 5)
    if p.tpot_p95_s is not None:
        out["tpot_p95_s"] = round(p.tpot_p95_s, 5)
    out["slo_attainment"] = round(p.attainment, 4)
    return out


def plan_to_dict(plan: Plan, choice: dict[str, Any] | None = None) -> dict[str, Any]:
    """The YAML-ready form of ``plan`` (see :func:`write_plan`). ``choice``: the deployment chosen
    by simulation (``tokenomy plan --choose``: ``deployment``, ``disaggregated``, ``why`` and the
    candidates); the pools written are then those of the topology it runs on."""
    req, st = plan.request, plan.stats
    solution = plan.solution
    if choice is not None and plan.other_mode is not None and choice["disaggregated"] != solution.disaggregated:
        solution = plan.other_mode
    pools = [{"role": o.candidate.role, "gpu": o.candidate.gpu, "tp": o.candidate.tp, "count": o.count,
              "predicted": _prediction(o.prediction)} for o in solution.chosen]
    _, metric, p95 = plan.bottleneck()
    out: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "model": req.model,
        "deployment": choice["deployment"] if choice else ("disagg" if plan.solution.disaggregated else "colocated"),
        "pools": pools,
        "objective": req.objective,
        "slo": {"ttft_s": req.slo.ttft_s, "tpot_s": req.slo.tpot_s},
        "inventory": dict(req.inventory),
        "workload": {"name": st.name, "session_rate_per_s": st.session_rate_per_s,
                     "request_rate_per_s": round(st.request_rate_per_s, 4)},
        "engine": {"max_num_batched_tokens": req.limits.max_num_batched_tokens,
                   "max_num_seqs": req.limits.max_num_seqs},
        "predicted": {"bottleneck": metric, "p95_s": round(p95, 5), "score": round(plan.solution.z, 4),
                      "usd_per_hour": round(plan.solution.usd_per_hour, 2),
                      "slo_attainment": round(plan.attainment, 4), "attainment_target": req.attainment_target},
        "binding": plan.binding,
    }
    if plan.shortfall is not None:
        out["shortfall"] = plan.shortfall
    if choice is not None:
        out["chosen_by_simulation"] = {k: v for k, v in choice.items() if k != "disaggregated"}
    if plan.runner_up is not None:
        out["runner_up"] = [{"role": o.candidate.role, "gpu": o.candidate.gpu, "tp": o.candidate.tp, "count": o.count}
                            for o in plan.runner_up.chosen]
    return out


def write_plan(plan: Plan, path: str | Path, choice: dict[str, Any] | None = None) -> None:
    Path(path).write_text(yaml.safe_dump(plan_to_dict(plan, choice), sort_keys=False))


def read_plan(path: str | Path) -> dict[str, Any]:
    """The plan file's contents, checked; raises ``ValueError`` naming the file on bad input."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--plan: {path} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"--plan: {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("pools"), list) or not data["pools"]:
        raise ValueError(f"--plan: {path} has no 'pools' list (not a tokenomy plan file)")
    for pool in data["pools"]:
        if not isinstance(pool, dict) or {"role", "gpu", "tp", "count"} - set(pool):
            raise ValueError(f"--plan: {path}: every pool needs role, gpu, tp and count")
    return data


def sim_overrides(path: str | Path) -> dict[str, Any]:
    """``SimConfig`` fields for the plan in ``path`` (deployment, model, shapes, counts)."""
    data = read_plan(path)
    pools = {p["role"]: p for p in data["pools"]}
    out: dict[str, Any] = {"model": data.get("model", "llama-3.1-8b")}
    if set(pools) == {"mixed"}:
        m = pools["mixed"]
        return out | {"deployment": "colocated", "gpu": m["gpu"], "tp": int(m["tp"]), "instances": int(m["count"])}
    if set(pools) != {"prefill", "decode"}:
        raise ValueError(f"--plan: {path}: pools must be one 'mixed' pool or a 'prefill' and a 'decode' pool")
    p, d = pools["prefill"], pools["decode"]
    return out | {
        "deployment": "disagg", "gpu": p["gpu"], "tp": int(p["tp"]),
        "prefill": int(p["count"]), "decode": int(d["count"]),
        "prefill_gpu": p["gpu"], "prefill_tp": int(p["tp"]), "decode_gpu": d["gpu"], "decode_tp": int(d["tp"]),
        "instances": int(p["count"]) + int(d["count"]),
    }


def deployment_label(path: str | Path) -> str:
    """The ``sim compare`` deployment of the plan: the variant it names (``ampd``, ``colocated-offload``,
    ... as ``tokenomy plan --choose`` writes; else ``colocated`` or ``disagg``), at the plan's split."""
    o = sim_overrides(path)
    name = str(read_plan(path).get("deployment") or o["deployment"])
    return name if o["deployment"] == "colocated" else f"{name}@{o['prefill']}:{o['decode']}"
