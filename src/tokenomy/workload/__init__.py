"""Workloads: sessions and arrivals, synthetic chat and agent generators, trace readers/writers.

Entry point: :func:`load_workload`. Every session's turns carry ``content`` segments so an
engine's prefix cache sees the sharing the workload implies (docs/workloads.md).
"""

from tokenomy.workload.agentic import (
    AGENT_PROFILES,
    GAIA,
    TOOLBENCH,
    AgentProfile,
    agent_sessions,
    get_profile,
)
from tokenomy.workload.arrivals import (
    ARRIVALS,
    gamma_arrivals,
    get_arrival,
    jitter_timestamps,
    poisson_arrivals,
    trace_arrivals,
)
from tokenomy.workload.azure import read_azure
from tokenomy.workload.chat import CHAT, ChatProfile, chat_sessions
from tokenomy.workload.dists import LogNormal
from tokenomy.workload.keys import StreamKeys
from tokenomy.workload.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    link_turns,
    read_mooncake,
    read_mooncake_requests,
)
from tokenomy.workload.registry import (
    FORMATS,
    MAX_SYNTHETIC_SESSIONS,
    SYNTHETIC,
    TRACE_LOADERS,
    WorkloadInfo,
    detect_format,
    load_workload,
    load_workload_info,
)
from tokenomy.workload.session_format import read_sessions, write_sessions
from tokenomy.workload.tenants import TenantMix, TierShare, assign_tenants

__all__ = [
    "AGENT_PROFILES",
    "ARRIVALS",
    "FORMATS",
    "MAX_SYNTHETIC_SESSIONS",
    "CHAT",
    "GAIA",
    "MOONCAKE_BLOCK_TOKENS",
    "SYNTHETIC",
    "TOOLBENCH",
    "TRACE_LOADERS",
    "WorkloadInfo",
    "AgentProfile",
    "ChatProfile",
    "LogNormal",
    "StreamKeys",
    "TenantMix",
    "TierShare",
    "agent_sessions",
    "assign_tenants",
    "chat_sessions",
    "detect_format",
    "gamma_arrivals",
    "get_arrival",
    "get_profile",
    "jitter_timestamps",
    "link_turns",
    "load_workload",
    "load_workload_info",
    "poisson_arrivals",
    "read_azure",
    "read_mooncake",
    "read_mooncake_requests",
    "read_sessions",
    "trace_arrivals",
    "write_sessions",
]
