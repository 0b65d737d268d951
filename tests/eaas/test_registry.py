from __future__ import annotations

import pytest

from tokenomy.eaas.registry import ExpertUnavailable, Registry, RoutingTable, ServerState


def _registry() -> Registry:
    reg = Registry()
    reg.register("a", "tcp://a", [0, 1])
    reg.register("b", "tcp://b", [1, 2])
    return reg


def test_replicas_are_used_round_robin() -> None:
    table = RoutingTable(_registry())
    assert [table.pick(1).server_id for _ in range(4)] == ["a", "b", "a", "b"]
    assert {table.pick(0).server_id for _ in range(3)} == {"a"}


def test_a_masked_server_gets_nothing_until_it_registers_again() -> None:
    reg = _registry()
    table = RoutingTable(reg)
    table.mask(reg.active_for(1)[0])
    assert {table.pick(1).server_id for _ in range(4)} == {"b"}
    assert [s.state for s in reg.servers() if s.server_id == "a"] == [ServerState.FAILED]
    with pytest.raises(ExpertUnavailable, match="expert 0.*masked here: \\['a'\\]"):
        table.pick(0)
    reg.register("a", "tcp://a2", [0, 1])  # recovered (new process, new address)
    assert table.pick(0).address == "tcp://a2"
    assert {table.pick(1).server_id for _ in range(4)} == {"a", "b"}


def test_a_stale_failure_report_does_not_mask_a_new_registration() -> None:
    reg = _registry()
    old = reg.active_for(0)[0]
    reg.register("a", "tcp://a2", [0])
    reg.mark_failed("a", old.epoch)
    assert [s.server_id for s in reg.active_for(0)] == ["a"]


def test_draining_server_gets_no_new_traffic_and_can_be_removed() -> None:
    reg = _registry()
    reg.drain("b")
    table = RoutingTable(reg)
    assert {table.pick(1).server_id for _ in range(4)} == {"a"}
    with pytest.raises(ExpertUnavailable):
        table.pick(2)
    reg.deregister("b")
    assert [s.server_id for s in reg.servers()] == ["a"]
    assert [e for e, _ in reg.events] == ["register", "register", "drain", "deregister"]


def test_a_new_server_gets_traffic_at_once() -> None:
    reg = _registry()
    table = RoutingTable(reg)
    table.pick(2)
    reg.register("c", "tcp://c", [2])
    assert {table.pick(2).server_id for _ in range(4)} == {"b", "c"}


def test_load_statistics_accumulate_per_expert_and_server() -> None:
    reg = _registry()
    reg.record("a", 1, 5)
    reg.record("b", 1, 3)
    assert reg.expert_tokens[1] == 8 and reg.server_tokens["a"] == 5


def test_unknown_server_and_empty_registration_fail_loudly() -> None:
    reg = _registry()
    with pytest.raises(KeyError, match="registered: a, b"):
        reg.drain("zz")
    with pytest.raises(ValueError, match="no experts"):
        reg.register("c", "tcp://c", [])
