from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main


def test_plan_prints_gpu_hours_and_saving(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "plan.json"
    assert main(["eaas", "plan", "--peak-gpus", "960", "--unit-gpus", "320", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours: EAAS" in out and "saving:" in out
    data = json.loads(out_json.read_text())
    assert data["unit_gpu_hours"] > data["elastic_gpu_hours"] > 0
    assert 0 < data["saving_vs_unit"] < 1


def test_serve_with_a_bad_expert_range_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
    assert main(["eaas", "serve", "--experts", "7-3"]) == 2
    assert "bad expert id range" in capsys.readouterr().err


def test_demo_rejects_a_kill_after_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eaas", "demo", "--seconds", "1", "--kill-one-at", "2"]) == 2
    assert "--kill-one-at" in capsys.readouterr().err


def test_plan_rejects_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eaas", "plan", "--peak-gpus", "-5"]) == 2
    assert "peak_gpus" in capsys.readouterr().err


@pytest.mark.integration
def test_demo_shows_failover_without_loss(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
    out_json = tmp_path / "demo.json"
    rc = main(["eaas", "demo", "--servers", "2", "--replicas", "2", "--seconds", "1.5", "--kill-one-at", "0.6",
               "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "killed s0" in out and "lost 0, wrong 0" in out and "OK" in out
    data = json.loads(out_json.read_text())
    assert data["lost_tokens"] == 0 and data["wrong_tokens"] == 0 and data["failovers"] >= 1


@pytest.mark.parametrize("argv", [["eaas", "serve", "--experts", "0-3"], ["eaas", "demo", "--seconds", "1"]])
def test_without_the_eaas_extra_serve_and_demo_say_what_to_install(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "install tokenomy[eaas]" in err[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [([], "--experts is required (without --expert-file)"), (["--expert-file", "absent.safetensors"], "not found")],
)
def test_serve_without_experts_or_with_a_missing_expert_file_is_a_one_line_error(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
    assert main(["eaas", "serve", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
