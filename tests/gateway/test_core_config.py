"""The gateway's config: the documented default, and one clear line for every bad file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.cli.main import main
from tokenomy.gateway.config import DEFAULT_PRICE, GatewayConfig, config_from_dict, load_config


def test_the_default_fronts_tokenomy_ups_default_cluster() -> None:
    cfg = load_config(None)
    assert [b.url for b in cfg.backends] == [f"http://127.0.0.1:{p}" for p in range(8100, 8104)]
    assert cfg.models() == ("llama-3.1-8b",) and cfg.router.name == "session_affinity"
    assert cfg.ledger.url == "sqlite:///tokenomy-ledger.db" and cfg.price("any") == DEFAULT_PRICE
    assert cfg == GatewayConfig()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"backends": [{"id": "a", "url": "ftp://x"}]}, "backends.0.url"),
        ({"backends": [{"id": "a", "url": "http://x"}, {"id": "a", "url": "http://y"}]}, "duplicate id 'a'"),
        ({"backends": []}, "at least one backend"),
        ({"router": {"name": "fastest"}}, "unknown router 'fastest'; known: round_robin"),
        ({"router": {"name": "prefix_aware", "options": {"overlap_weight": -1}}}, "overlap_weight must be >= 0"),
        ({"server": {"port": 70000}}, "server.port"),
        ({"ledger": {"synchronous": "OFF"}}, "ledger.synchronous"),
        ({"prices": {"m": {"input_per_mtok": 1}}}, "prices.m.cached_input_per_mtok"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"ops": {"no_such_field": 1}}, "ops."),
    ],
)
def test_bad_config_is_one_line_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=None) as exc:
        config_from_dict(data, source="gateway.yaml")
    text = str(exc.value)
    assert text.startswith("gateway.yaml: ") and message in text and "\n" not in text


def test_serve_refuses_bad_files_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: [oops\n")
    assert main(["serve", "--config", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    bad.write_text("- a list\n")
    assert main(["serve", "--config", str(bad)]) == 2
    assert "must be a mapping" in capsys.readouterr().err
    bad.write_text("server: {port: 8000}\n")
    assert main(["serve", "--config", str(bad), "--port", "-1"]) == 2
    assert "--port" in capsys.readouterr().err
