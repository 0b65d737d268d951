"""Typed options of the simulator's admission gate (``SimConfig.admission``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenomy.policy.closedloop import ClosedLoopConfig, RetryPolicy


@dataclass(frozen=True)
class AdmissionOptions:
    """The front door of a simulated cluster: a policy by name, the in-flight cap, its config.

    ``max_in_flight`` is the cluster-wide cap on admitted, unfinished requests (the gateway's
    ``admission.max_in_flight``); pick it near the concurrency at which the cluster still meets
    its SLO (docs/closed-loop.md shows how the benchmark picked its own). ``retry_after_s`` is the
    ``retry-after`` a shed request is answered with (the gateway's ``ops.admission.retry_after_s``,
    default 1 s there too); ``retry`` is how the simulated clients answer a refusal (the rule
    ``tokenomy bench`` applies; ``RetryPolicy(max_retries=0)``: a refusal ends the session).
    """

    policy: str = "tier_wfq"
    max_in_flight: int = 64
    closed_loop: ClosedLoopConfig = field(default_factory=ClosedLoopConfig)
    retry_after_s: int = 1
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s must be >= 1, got {self.retry_after_s}")
