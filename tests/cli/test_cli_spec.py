"""`--spec` and `--save-spec`: a saved experiment reruns to the same numbers; progress lines off a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import build_parser, main

COMPARE = ["sim", "compare", "--workload", "toolbench", "--duration", "8", "--instances", "2",
           "--deployments", "colocated,ampd", "--rates", "0.5,1", "--workers", "1"]


def test_a_saved_spec_reruns_to_the_same_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, first, second = tmp_path / "e.yaml", tmp_path / "a.json", tmp_path / "b.json"
    assert main([*COMPARE, "--save-spec", str(spec), "--json", str(first)]) == 0
    err = capsys.readouterr().err
    # Not a terminal: one line per finished simulation, with an ETA.
    assert err.count("ETA") == 4 and "[4/4]" in err
    assert main(["sim", "compare", "--spec", str(spec), "--workers", "1", "--json", str(second)]) == 0
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    for d in (a, b):
        for dep in d["deployments"].values():
            for run in dep["runs"]:
                run.pop("wall_s")
    assert a == b and a["spec"]["workload"]["source"] == "toolbench"


def test_flags_override_a_spec(tmp_path: Path) -> None:
    spec, out = tmp_path / "e.yaml", tmp_path / "o.json"
    assert main([*COMPARE, "--save-spec", str(spec), "--quiet"]) == 0
    assert main(["sim", "compare", "--spec", str(spec), "--rates", "2", "--deployments", "colocated",
                 "--workers", "1", "--quiet", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["rates"] == [2.0] and list(payload["deployments"]) == ["colocated"]


def test_sim_embeds_its_spec_and_refuses_a_sweep_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, spec = tmp_path / "s.json", tmp_path / "e.yaml"
    assert main(["sim", "--workload", "chat", "--duration", "5", "--instances", "2", "--deployments",
                 "colocated,disagg@1:1", "--quiet", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["schema"] == "tokenomy.sim/2"
    assert payload["spec"]["cluster"]["instances"] == 2
    assert payload["deployments"]["disagg@1:1"]["split"] == {"prefill": 1, "decode": 1}
    assert payload["workload"]["format"] == "synthetic:poisson"
    assert main([*COMPARE, "--save-spec", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sim", "--spec", str(spec), "--quiet"]) == 2
    assert "sim compare --spec" in capsys.readouterr().err


def test_help_gives_every_flag_a_line_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["sim", "--help"], ["sim", "compare", "--help"]):
        assert main(argv) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "(default: gaia)" in text and "(default: 8)" in text and "--deployments NAMES" in text
    parser = build_parser()
    sim = parser._subparsers._group_actions[0].choices["sim"]  # type: ignore[union-attr]
    compare = sim._subparsers._group_actions[0].choices["compare"]  # type: ignore[union-attr]
    for p in (sim, compare):
        for action in p._actions:
            assert action.help, f"{p.prog} {action.option_strings} has no help line"
