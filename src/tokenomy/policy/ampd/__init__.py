"""AMPD: session binding, adaptive local/remote prefill placement, look-ahead queue reordering
and KV retention across tool calls. Pure decision objects; docs/ampd.md states their rules."""

from tokenomy.policy.ampd.binding import BindingConfig, BindingDecision, SessionBinder
from tokenomy.policy.ampd.placement import AdaptivePlacement, PlacementConfig, PlacementDecision
from tokenomy.policy.ampd.reorder import LookaheadReorder, PrefillTask, ReorderConfig
from tokenomy.policy.ampd.retention import (
    KVRetentionPolicy,
    RetainedKV,
    Retention,
    RetentionConfig,
    RetentionDecision,
)

__all__ = [
    "AdaptivePlacement",
    "BindingConfig",
    "BindingDecision",
    "KVRetentionPolicy",
    "LookaheadReorder",
    "PlacementConfig",
    "PlacementDecision",
    "PrefillTask",
    "ReorderConfig",
    "RetainedKV",
    "Retention",
    "RetentionConfig",
    "RetentionDecision",
    "SessionBinder",
]
