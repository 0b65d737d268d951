"""``tokenomy tenants`` and ``tokenomy keys`` against a config's database; bad input exits 2."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from helpers.ops_factory import SECRET, FakeClock, FakeConfig, request
from tokenomy.cli.main import main
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.build import build_guard


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"ledger": {"url": f"sqlite:///{tmp_path / 'g.db'}"},
                                    "ops": {"server_secret": SECRET}}))
    return path


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out.strip(), err.strip()


def test_create_org_team_key_use_it_then_revoke(capsys, config, tmp_path):
    _, org, _ = cli(capsys, "tenants", "create-org", "acme", "--rpm", "100", "--config", str(config))
    _, team, _ = cli(capsys, "tenants", "create-team", "ml", "--org", org, "--config", str(config))
    rc, out, _ = cli(capsys, "keys", "create", "--team", team, "--name", "ci", "--rpm", "5",
                     "--config", str(config))
    assert rc == 0
    key_id, raw = out.split("\t")
    rc, listing, _ = cli(capsys, "keys", "list", "--config", str(config))
    assert key_id in listing and raw not in listing
    clock = FakeClock()
    guard = build_guard(FakeConfig({"server_secret": SECRET}), db_url=f"sqlite:///{tmp_path / 'g.db'}", clock=clock)
    asyncio.run(guard.admit(request(raw, "r1")))
    assert cli(capsys, "keys", "revoke", key_id, "--config", str(config))[0] == 0
    clock.advance(1.0)  # ops.tenant_refresh_s, the default
    with pytest.raises(GatewayError) as err:  # the running guard sees the CLI's revocation
        asyncio.run(guard.admit(request(raw, "r2")))
    assert err.value.status == 401


@pytest.mark.parametrize("argv, needle", [
    (["tenants", "create-team", "t", "--org", "org_nope"], "needs an existing org"),
    (["tenants", "create-org", "o", "--rpm", "-3"], "--rpm"),
    (["keys", "revoke", "key_nope"], "unknown tenant node"),
    (["tenants", "set-limits", "org_nope", "--rpm", "3"], "unknown tenant node"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, config, argv, needle):
    rc, _, err = cli(capsys, *argv, "--config", str(config))
    assert rc == 2 and needle in err and len(err.splitlines()) == 1


def test_a_child_above_its_parent_is_refused(capsys, config):
    _, org, _ = cli(capsys, "tenants", "create-org", "o", "--budget-usd", "5", "--config", str(config))
    rc, _, err = cli(capsys, "tenants", "create-team", "t", "--org", org, "--budget-usd", "9",
                     "--config", str(config))
    assert rc == 2 and "exceeds the parent's budget_usd" in err


def test_keys_new_prints_a_fresh_key(capsys):
    rc, out, _ = cli(capsys, "keys", "new")
    assert rc == 0 and out.startswith("tk-") and len(out) == 46
