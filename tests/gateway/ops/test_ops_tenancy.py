"""Tenancy: the key tree, key handling, revocation and isolation between tenants."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from helpers.ops_factory import SECRET, add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.keys import KEY_LENGTH, hash_key
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits
from tokenomy.gateway.stores.tenancy_sql import TenantStore, sqlite_engine


def admit(guard, req):
    return asyncio.run(guard.admit(req))


def test_key_format_and_only_a_digest_is_stored(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard)
    assert raw.startswith("tk-") and len(raw) == KEY_LENGTH
    with guard.store.engine.connect() as conn:
        dump = "\n".join(str(tuple(r)) for r in conn.execute(sa.text("SELECT * FROM tk_nodes")))
    assert raw not in dump and raw[3:20] not in dump
    assert hash_key(SECRET.encode(), raw) in dump
    assert admit(guard, request(raw, "r1")).key_id == key_id


@pytest.mark.parametrize("key, code", [
    (None, "missing_api_key"),
    ("", "missing_api_key"),
    ("sk-not-ours", "invalid_api_key"),
    ("tk-" + "A" * 43, "invalid_api_key"),
])
def test_bad_keys_get_401_with_openai_error(tmp_path, key, code):
    guard = make_guard(tmp_path)
    add_key(guard)
    with pytest.raises(GatewayError) as err:
        admit(guard, request(key, "r1"))
    assert err.value.status == 401 and err.value.code == code
    assert err.value.body()["error"]["type"] == "authentication_error"


def test_revocation_is_effective_on_the_next_request_even_from_another_process(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard)
    asyncio.run(guard.admit(request(raw, "r1")))
    # another process (the CLI) opens the same database and revokes the key
    other = TenantStore(sqlite_engine(f"sqlite:///{tmp_path / 'ops.db'}"), SECRET.encode())
    other.revoke(key_id)
    with pytest.raises(GatewayError) as err:
        admit(guard, request(raw, "r2"))
    assert err.value.status == 401


def test_revoking_a_team_revokes_its_keys(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard)
    team_id = guard.store.tree.get(key_id).parent_id
    admit(guard, request(raw, "r0"))  # the key is known live (remembered) before its team is revoked
    guard.store.revoke(team_id)
    with pytest.raises(GatewayError):
        admit(guard, request(raw, "r1"))


@pytest.mark.parametrize("field, parent, child", [
    ("rpm", 100, 101), ("tpm", 1000, 5000), ("max_concurrent", 4, 5), ("budget_usd", 10.0, 10.5),
    ("priority", 3, 7),
])
def test_a_child_cannot_be_granted_more_than_its_parent(tmp_path, field, parent, child):
    guard = make_guard(tmp_path)
    store = guard.store
    org = store.create_node(NodeKind.ORG, "o", None, NodeLimits(**{field: parent}))
    with pytest.raises(ValueError, match=field):
        store.create_node(NodeKind.TEAM, "t", org.id, NodeLimits(**{field: child}))
    team = store.create_node(NodeKind.TEAM, "t", org.id, NodeLimits(**{field: parent}))
    with pytest.raises(ValueError, match=field):
        store.create_key(team.id, "k", NodeLimits(**{field: child}))
    node, _ = store.create_key(team.id, "k", NodeLimits(**{field: parent}))
    # nor by update: raising the key, or lowering the org under its descendants
    with pytest.raises(ValueError, match=field):
        store.update_limits(node.id, NodeLimits(**{field: child}))
    with pytest.raises(ValueError, match=field):
        store.update_limits(org.id, NodeLimits(**{field: parent - 1}))


def test_models_and_tree_shape_are_checked(tmp_path):
    store = make_guard(tmp_path).store
    org = store.create_node(NodeKind.ORG, "o", None, NodeLimits(allowed_models=("a", "b")))
    with pytest.raises(ValueError, match="not allowed"):
        store.create_node(NodeKind.TEAM, "t", org.id, NodeLimits(allowed_models=("c",)))
    with pytest.raises(ValueError, match="parent"):
        store.create_key(org.id, "k")  # a key hangs under a team
    with pytest.raises(ValueError, match="parent"):
        store.create_node(NodeKind.TEAM, "t", None)


def test_effective_limits_are_the_minimum_along_the_path_and_models_are_enforced(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard, org=NodeLimits(rpm=50, allowed_models=("m", "n")),
                          team=NodeLimits(tpm=9000, allowed_models=("m",)), key=NodeLimits(rpm=20))
    eff = guard.store.tree.effective(key_id)
    assert (eff.rpm, eff.tpm, eff.allowed_models) == (20, 9000, frozenset({"m"}))
    with pytest.raises(GatewayError) as err:
        admit(guard, request(raw, "r1", model="n"))
    assert err.value.status == 403 and err.value.code == "model_not_allowed"


def test_a_key_cannot_exceed_its_parents_limits_at_run_time(tmp_path):
    """Two keys of one team share the team's 3 rpm, whatever their own limits."""
    guard = make_guard(tmp_path)
    store = guard.store
    org = store.create_node(NodeKind.ORG, "o", None)
    team = store.create_node(NodeKind.TEAM, "t", org.id, NodeLimits(rpm=3))
    keys = [store.create_key(team.id, f"k{i}")[1] for i in range(2)]
    served = 0
    for i in range(6):
        try:
            admit(guard, request(keys[i % 2], f"r{i}"))
            served += 1
        except GatewayError as err:
            assert err.code == "rate_limit_rpm"
    assert served == 3


def test_a_key_reads_only_its_own_usage_and_admin_reads_all(tmp_path):
    guard = make_guard(tmp_path, admin_key="admin-" + "x" * 20)
    raw_a, key_a = add_key(guard, org_name="a")
    raw_b, key_b = add_key(guard, org_name="b")
    scope_a = asyncio.run(guard.usage_scope(raw_a))
    assert scope_a[-1] == key_a and key_b not in scope_a
    assert guard.visible_key_ids(key_a) == {key_a}
    assert asyncio.run(guard.usage_scope("admin-" + "x" * 20)) == ()
    guard.store.revoke(key_a)
    with pytest.raises(GatewayError):
        asyncio.run(guard.usage_scope(raw_a))
