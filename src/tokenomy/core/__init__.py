"""Domain types shared by every package. Depends on nothing."""

from tokenomy.core.instance import Role
from tokenomy.core.records import RequestRecord
from tokenomy.core.request import Request, Segment, Session, Turn
from tokenomy.core.slo import SLO
from tokenomy.core.step import StepShape, StepTimeModel
from tokenomy.core.usage import TokenUsage

__all__ = [
    "SLO",
    "Request",
    "RequestRecord",
    "Role",
    "Segment",
    "Session",
    "StepShape",
    "StepTimeModel",
    "TokenUsage",
    "Turn",
]
