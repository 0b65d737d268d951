"""The admin API: create tenants and keys, refuse limits above the parent, revoke; admin key only."""

from __future__ import annotations

import asyncio

import pytest
from starlette.testclient import TestClient

from helpers.ops_factory import make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.admin import build_admin_router

ADMIN = "admin-" + "k" * 26
AUTH = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture()
def admin(tmp_path):
    guard = make_guard(tmp_path, admin_key=ADMIN)
    with TestClient(build_admin_router(guard)) as client:
        yield guard, client


def test_create_tree_key_shown_once_then_revoke(admin):
    guard, client = admin
    org = client.post("/tenants", json={"kind": "org", "name": "acme", "limits": {"rpm": 100}}, headers=AUTH)
    assert org.status_code == 201
    team = client.post("/tenants", json={"kind": "team", "name": "ml", "parent_id": org.json()["id"]},
                       headers=AUTH).json()
    key = client.post("/keys", json={"team_id": team["id"], "name": "ci", "limits": {"rpm": 10}}, headers=AUTH)
    assert key.status_code == 201
    raw = key.json()["api_key"]
    listed = client.get("/keys", headers=AUTH).json()["data"]
    assert raw not in str(listed) and listed[0]["key_hint"].startswith("tk-")
    asyncio.run(guard.admit(request(raw, "r1")))
    assert client.post(f"/keys/{key.json()['id']}/revoke", headers=AUTH).json()["revoked"] is True
    with pytest.raises(GatewayError):
        asyncio.run(guard.admit(request(raw, "r2")))


def test_limit_above_parent_is_refused_with_400(admin):
    _, client = admin
    org = client.post("/tenants", json={"kind": "org", "name": "o", "limits": {"budget_usd": 5}}, headers=AUTH)
    r = client.post("/tenants", json={"kind": "team", "name": "t", "parent_id": org.json()["id"],
                                      "limits": {"budget_usd": 6}}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "limit_exceeds_parent"
    team = client.post("/tenants", json={"kind": "team", "name": "t", "parent_id": org.json()["id"]},
                       headers=AUTH).json()
    r = client.patch(f"/tenants/{team['id']}", json={"limits": {"budget_usd": 50}}, headers=AUTH)
    assert r.status_code == 400


@pytest.mark.parametrize("method, path, body, status", [
    ("post", "/tenants", {"kind": "key", "name": "x"}, 400),
    ("post", "/tenants", {"kind": "org"}, 400),
    ("post", "/tenants", {"kind": "org", "name": "x", "limits": {"rpm": -1}}, 400),
    ("post", "/tenants", {"kind": "org", "name": "x", "limits": {"bogus": 1}}, 400),
    ("post", "/keys", {"team_id": "team_nope", "name": "x"}, 400),
    ("patch", "/tenants/nope", {"limits": {}}, 404),
    ("get", "/budget/nope", None, 404),
])
def test_bad_admin_input_gets_openai_errors(admin, method, path, body, status):
    _, client = admin
    r = getattr(client, method)(path, headers=AUTH, **({"json": body} if body is not None else {}))
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_admin_key_required(admin):
    _, client = admin
    assert client.get("/tenants").status_code == 401
    assert client.get("/tenants", headers={"authorization": "Bearer tk-wrong"}).status_code == 401
    r = client.post("/tenants", content=b"{not json", headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
