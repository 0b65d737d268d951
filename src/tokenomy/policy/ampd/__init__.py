"""AMPD: session binding, adaptive local/remote prefill placement, look-ahead queue reordering,
prefill dispatch, tool-latency estimation, and KV retention across tool calls (keep / offload /
drop, host-tier eviction). Pure decision objects; docs/ampd.md states their rules.
``build_ampd_policies`` builds them all from the ``AMPD_POLICIES`` registry."""

from tokenomy.policy.ampd.admission import AdmissionDecision, AdmissionTask, SlackAdmission
from tokenomy.policy.ampd.binding import BindingConfig, BindingDecision, SessionBinder, history_follows
from tokenomy.policy.ampd.dispatch import DispatchConfig, DispatchDecision, PrefillDispatch
from tokenomy.policy.ampd.factory import (
    AMPD_POLICIES,
    AmpdPolicies,
    AmpdPolicyConfig,
    PolicyDeps,
    build_ampd_policies,
)
from tokenomy.policy.ampd.host_tier import HostCopyView, HostEvictionDecision, HostEvictionPolicy
from tokenomy.policy.ampd.placement import AdaptivePlacement, PlacementConfig, PlacementDecision
from tokenomy.policy.ampd.reorder import LookaheadReorder, PrefillTask, ReorderConfig
from tokenomy.policy.ampd.retention import (
    KVRetentionPolicy,
    RetainedKV,
    Retention,
    RetentionConfig,
    RetentionDecision,
)
from tokenomy.policy.ampd.tool_latency import ToolLatencyConfig, ToolLatencyEstimate, ToolLatencyEstimator

__all__ = [
    "AMPD_POLICIES",
    "AdaptivePlacement",
    "AdmissionDecision",
    "AdmissionTask",
    "AmpdPolicies",
    "AmpdPolicyConfig",
    "BindingConfig",
    "BindingDecision",
    "DispatchConfig",
    "DispatchDecision",
    "HostCopyView",
    "HostEvictionDecision",
    "HostEvictionPolicy",
    "KVRetentionPolicy",
    "LookaheadReorder",
    "PlacementConfig",
    "PlacementDecision",
    "PolicyDeps",
    "PrefillDispatch",
    "PrefillTask",
    "ReorderConfig",
    "RetainedKV",
    "Retention",
    "RetentionConfig",
    "RetentionDecision",
    "SessionBinder",
    "SlackAdmission",
    "ToolLatencyConfig",
    "ToolLatencyEstimate",
    "ToolLatencyEstimator",
    "build_ampd_policies",
    "history_follows",
]
