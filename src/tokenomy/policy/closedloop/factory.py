"""Closed-loop admission policies by name, for the simulator and the gateway alike.

``ADMISSION_POLICIES`` maps a name to a factory ``(ClosedLoopConfig, trace) -> AdmissionPolicy``:
``fifo`` (tenant-blind) and ``tier_wfq`` (the closed loop). The simulator's admission gate and
the gateway's admission pool both build theirs with :func:`make_admission_policy`.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.policy.closedloop.admission import AdmissionPolicy, BlindFIFO, TierWFQ
from tokenomy.policy.closedloop.tiers import ClosedLoopConfig
from tokenomy.policy.registry import Registry
from tokenomy.policy.trace import TraceSink

AdmissionFactory = Callable[[ClosedLoopConfig, TraceSink | None], AdmissionPolicy]
ADMISSION_POLICIES: Registry[AdmissionFactory] = Registry("admission policy")


@ADMISSION_POLICIES.register("fifo")
def _fifo(config: ClosedLoopConfig, trace: TraceSink | None) -> AdmissionPolicy:
    return BlindFIFO(config, trace=trace)


@ADMISSION_POLICIES.register("tier_wfq")
def _tier_wfq(config: ClosedLoopConfig, trace: TraceSink | None) -> AdmissionPolicy:
    return TierWFQ(config, trace=trace)


def make_admission_policy(name: str, config: ClosedLoopConfig | None = None,
                          trace: TraceSink | None = None) -> AdmissionPolicy:
    """The admission policy registered as ``name``; ValueError naming the known ones otherwise."""
    return ADMISSION_POLICIES.get(name)(config or ClosedLoopConfig(), trace)
