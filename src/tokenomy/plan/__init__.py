"""Deployment planner: how many prefill/decode (or mixed) instances, at which TP, on which GPUs.

See docs/planner.md for the formulation. Entry points: :func:`plan` (library),
``tokenomy plan`` (CLI), :func:`sim_config_from_plan` (run a saved plan in the simulator).
"""

from tokenomy.plan.options import Candidate, EngineLimits, Option
from tokenomy.plan.planner import Plan, PlanInfeasible, PlanRequest, plan
from tokenomy.plan.stats import WorkloadStats, workload_stats

__all__ = [
    "Candidate",
    "EngineLimits",
    "Option",
    "Plan",
    "PlanInfeasible",
    "PlanRequest",
    "WorkloadStats",
    "plan",
    "workload_stats",
]
