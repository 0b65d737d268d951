"""One place that builds AMPD's policy objects, for the simulator and the gateway alike.

``build_ampd_policies(config, estimator, ...)`` builds every AMPD decision-maker from the
factories registered by name in ``AMPD_POLICIES``. The simulator's AMPD deployment and its
host-tier baselines call it, and so does any live path, so both make their decisions with the
same classes, configured the same way (``tests/sim/test_sim_policies.py`` checks the simulator
side). A mechanism switched off in the config (``binding=None`` etc.) is built as None, and the
caller falls back to its plain behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.policy.ampd.admission import SlackAdmission
from tokenomy.policy.ampd.binding import BindingConfig, SessionBinder
from tokenomy.policy.ampd.dispatch import DispatchConfig, PrefillDispatch
from tokenomy.policy.ampd.host_tier import HostEvictionPolicy
from tokenomy.policy.ampd.placement import AdaptivePlacement, PlacementConfig
from tokenomy.policy.ampd.reorder import LookaheadReorder, ReorderConfig
from tokenomy.policy.ampd.retention import KVRetentionPolicy, RetentionConfig
from tokenomy.policy.ampd.tool_latency import ToolLatencyConfig, ToolLatencyEstimator
from tokenomy.policy.estimator import Estimator
from tokenomy.policy.registry import Registry
from tokenomy.policy.trace import TraceSink


@dataclass(frozen=True)
class AmpdPolicyConfig:
    """Which AMPD mechanisms run (None / False: off) and their configs. Defaults are docs/ampd.md's."""

    binding: BindingConfig | None = field(default_factory=BindingConfig)
    placement: PlacementConfig | None = field(default_factory=PlacementConfig)
    reorder: ReorderConfig | None = field(default_factory=ReorderConfig)
    retention: RetentionConfig | None = field(default_factory=RetentionConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    tool_latency: ToolLatencyConfig = field(default_factory=ToolLatencyConfig)
    admission: bool = True  # slack-ordered admission on a full decode instance


@dataclass(frozen=True)
class PolicyDeps:
    """What factories may use besides the config: the cost model, PCIe bandwidth, the trace sink."""

    estimator: Estimator
    pcie_bytes_per_s: float
    trace: TraceSink | None = None
    prefill_estimator: Estimator | None = None  # the prefill pool's, where its GPUs differ (None: estimator)

    @property
    def prefill(self) -> Estimator:
        return self.prefill_estimator or self.estimator


PolicyFactory = Callable[[AmpdPolicyConfig, PolicyDeps], Any]
AMPD_POLICIES: Registry[PolicyFactory] = Registry("AMPD policy")


@AMPD_POLICIES.register("binding")
def _binding(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> SessionBinder | None:
    return None if cfg.binding is None else SessionBinder(cfg.binding, trace=deps.trace)


@AMPD_POLICIES.register("placement")
def _placement(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> AdaptivePlacement | None:
    if cfg.placement is None:
        return None
    return AdaptivePlacement(cfg.placement, deps.estimator, trace=deps.trace, prefill_estimator=deps.prefill)


@AMPD_POLICIES.register("dispatch")
def _dispatch(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> PrefillDispatch:
    reorder = None if cfg.reorder is None else LookaheadReorder(cfg.reorder, deps.prefill)
    return PrefillDispatch(cfg.dispatch, reorder, trace=deps.trace)


@AMPD_POLICIES.register("retention")
def _retention(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> KVRetentionPolicy | None:
    if cfg.retention is None:
        return None
    return KVRetentionPolicy(cfg.retention, deps.estimator, deps.pcie_bytes_per_s, trace=deps.trace)


@AMPD_POLICIES.register("tool_latency")
def _tool_latency(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> ToolLatencyEstimator:
    return ToolLatencyEstimator(cfg.tool_latency, trace=deps.trace)


@AMPD_POLICIES.register("host_eviction")
def _host_eviction(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> HostEvictionPolicy:
    return HostEvictionPolicy(trace=deps.trace)


@AMPD_POLICIES.register("admission")
def _admission(cfg: AmpdPolicyConfig, deps: PolicyDeps) -> SlackAdmission | None:
    if not cfg.admission:
        return None
    return SlackAdmission(deps.estimator, trace=deps.trace)


@dataclass
class AmpdPolicies:
    """Every AMPD decision-maker of one deployment; ``built_from`` lists the registry entries used."""

    binder: SessionBinder | None
    placement: AdaptivePlacement | None
    dispatch: PrefillDispatch
    retention: KVRetentionPolicy | None
    tool_latency: ToolLatencyEstimator
    host_eviction: HostEvictionPolicy
    admission: SlackAdmission | None
    config: AmpdPolicyConfig
    built_from: tuple[str, ...]


def build_ampd_policies(
    config: AmpdPolicyConfig,
    estimator: Estimator,
    *,
    pcie_bytes_per_s: float,
    trace: TraceSink | None = None,
    prefill_estimator: Estimator | None = None,
) -> AmpdPolicies:
    """Build every AMPD policy from its ``AMPD_POLICIES`` entry.

    ``estimator`` prices work on the decode (session-holding) instances; ``prefill_estimator``
    work on prefill instances where their GPUs or TP differ (heterogeneous pools).
    ``pcie_bytes_per_s`` is one instance's bandwidth to its host memory (prices offloads);
    ``trace`` receives every decision as a flat event (``tokenomy.policy.trace``).
    """
    deps = PolicyDeps(estimator, pcie_bytes_per_s, trace, prefill_estimator)
    built = {name: AMPD_POLICIES.get(name)(config, deps) for name in AMPD_POLICIES.names()}
    return AmpdPolicies(
        binder=built["binding"],
        placement=built["placement"],
        dispatch=built["dispatch"],
        retention=built["retention"],
        tool_latency=built["tool_latency"],
        host_eviction=built["host_eviction"],
        admission=built["admission"],
        config=config,
        built_from=tuple(built),
    )
