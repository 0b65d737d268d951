"""Shared factories: tiny model weights, expert-server fleets that are always stopped, clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.util import find_spec
from typing import TYPE_CHECKING

import pytest

from tokenomy.eaas.config import MoEConfig, preset
from tokenomy.eaas.launcher import ServerProcess, start_servers, stop_all
from tokenomy.eaas.registry import Registry, RoutingTable

if TYPE_CHECKING:
    from tokenomy.eaas.client import AttentionClient
    from tokenomy.eaas.moe import MoEWeights

# torch and pyzmq come with the eaas extra; modules that need them skip without it (importorskip).
if find_spec("torch") is not None:
    import torch

    torch.set_num_threads(1)

Fleet = Callable[..., list[ServerProcess]]


@pytest.fixture(scope="session")
def cfg() -> MoEConfig:
    return preset("deepseek-tiny")


@pytest.fixture(scope="session")
def weights(cfg: MoEConfig) -> MoEWeights:
    from tokenomy.eaas.moe import MoEWeights

    return MoEWeights.from_seed(cfg, 0)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    """``fleet(placement, **kw)`` starts servers; all of them are stopped when the test ends."""
    started: list[ServerProcess] = []

    def start(placement: Mapping[str, Sequence[int]], **kw: object) -> list[ServerProcess]:
        servers = start_servers(placement, **kw)  # type: ignore[arg-type]
        started.extend(servers)
        return servers

    try:
        yield start
    finally:
        stop_all(started)


def registry_for(servers: Sequence[ServerProcess]) -> Registry:
    reg = Registry()
    for s in servers:
        reg.register(s.server_id, s.address, s.expert_ids)
    return reg


def client_for(weights: MoEWeights, reg: Registry, timeout_s: float = 2.0) -> AttentionClient:
    from tokenomy.eaas.client import AttentionClient

    return AttentionClient(weights, RoutingTable(reg), timeout_s=timeout_s)
