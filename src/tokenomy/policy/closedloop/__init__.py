"""The closed loop: tenant tier, consumption rate and remaining budget steer admission and
routing (docs/closed-loop.md). Pure decision objects; importing this package registers the
``tier_aware`` router and the ``fifo`` / ``tier_wfq`` admission policies."""

from tokenomy.policy.closedloop import routing as _routing  # noqa: F401  (registers tier_aware)
from tokenomy.policy.closedloop.admission import (
    Action,
    AdmissionPolicy,
    ArrivalView,
    BlindFIFO,
    GateDecision,
    LoadView,
    PickDecision,
    QueuedView,
    TenantView,
    TierWFQ,
)
from tokenomy.policy.closedloop.consumption import ConsumptionMeter
from tokenomy.policy.closedloop.factory import ADMISSION_POLICIES, make_admission_policy
from tokenomy.policy.closedloop.retry import RETRY_STATUSES, RetryPolicy
from tokenomy.policy.closedloop.routing import TierAwareRouter
from tokenomy.policy.closedloop.tiers import DEFAULT_TIERS, ClosedLoopConfig, DegradeConfig, TierSpec

__all__ = [
    "ADMISSION_POLICIES",
    "DEFAULT_TIERS",
    "Action",
    "AdmissionPolicy",
    "ArrivalView",
    "BlindFIFO",
    "ClosedLoopConfig",
    "ConsumptionMeter",
    "DegradeConfig",
    "GateDecision",
    "LoadView",
    "PickDecision",
    "QueuedView",
    "RETRY_STATUSES",
    "RetryPolicy",
    "TenantView",
    "TierAwareRouter",
    "TierSpec",
    "TierWFQ",
    "make_admission_policy",
]
