"""The simulator's side of ``build_ampd_policies``: a ``SimConfig`` mapped to the policy config.

AMPD and the host-tier baselines get their decision-makers only from here, so the simulator
builds them through the same registry entries (``tokenomy.policy.ampd.AMPD_POLICIES``) a live
gateway uses.
"""

from __future__ import annotations

from dataclasses import replace

from tokenomy.core import Role
from tokenomy.perf import PerfModel
from tokenomy.policy.ampd import (
    AmpdPolicies,
    AmpdPolicyConfig,
    DispatchConfig,
    ToolLatencyConfig,
    build_ampd_policies,
)
from tokenomy.sim.base import SimContext
from tokenomy.sim.config import SimConfig


def ampd_policy_config(config: SimConfig) -> AmpdPolicyConfig:
    """The policy config of ``config.ampd``; mechanisms switched off there are None.

    The prefill budget used to price queued prompt tokens is the prefill engines' own step
    budget, and dispatch releases one such step at a time.
    """
    opts = config.ampd
    budget = config.max_num_batched_tokens
    placement = opts.placement_config
    if placement.prefill_budget_tokens != budget:
        placement = replace(placement, prefill_budget_tokens=budget)
    return AmpdPolicyConfig(
        binding=opts.binding_config if opts.binding else None,
        placement=placement if opts.placement else None,
        reorder=opts.reorder_config if opts.reorder else None,
        retention=opts.retention_config if opts.retention else None,
        dispatch=DispatchConfig(engine_budget_tokens=budget),
        tool_latency=ToolLatencyConfig(prior_s=opts.tool_latency_prior_s),
        admission=opts.admission,
    )


def pcie_bytes_per_s(ctx: SimContext) -> float:
    """One instance's bandwidth to host memory: every TP rank has its own PCIe link."""
    return ctx.perf.gpu.pcie_bytes_per_s * ctx.config.tp


def sim_policies(ctx: SimContext, decode_perf: PerfModel | None = None) -> AmpdPolicies:
    """AMPD's policies for the simulated cluster ``ctx``, tracing to ``ctx.decision_trace``;
    ``decode_perf``: price decode-side work with this model (decode instances of another shape
    than the decode role's, ``SimConfig.prefill_type_decodes``)."""
    return build_ampd_policies(
        ampd_policy_config(ctx.config),
        decode_perf or ctx.role_perf.get(Role.DECODE, ctx.perf),
        pcie_bytes_per_s=pcie_bytes_per_s(ctx),
        trace=ctx.decision_trace,
        prefill_estimator=ctx.role_perf.get(Role.PREFILL),
    )
