"""Inputs no plan can serve: one line on stderr naming the reason (and the limit), exit status 2."""

from __future__ import annotations

import re

import pytest

from tokenomy.cli.main import main

BASE = ["plan", "--workload", "chat", "--duration", "30"]


def _fail(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(BASE + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_ttft_slo_below_the_physical_minimum_names_that_minimum(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(["--rate", "1", "--slo-ttft", "0.001"], capsys)
    m = re.search(r"--slo-ttft 0.001 s is below the physical minimum ([0-9.]+) s", line)
    assert m and float(m.group(1)) > 0.001, line


def test_tpot_slo_below_the_physical_minimum_names_that_minimum(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(["--rate", "1", "--slo-tpot", "0.0001"], capsys)
    m = re.search(r"--slo-tpot 0.0001 s is below the physical minimum ([0-9.]+) s", line)
    assert m and float(m.group(1)) > 0.0001, line


def test_weights_that_fit_no_tp_are_explained(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(["--rate", "1", "--model", "llama-3.1-70b", "--gpus", "l40s:2"], capsys)
    assert "weights" in line and "do not fit at any TP" in line and "L40S x 2" in line, line


def test_tp_is_limited_to_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    # 16 L40S would hold a 70B model at TP 8, but not within nodes of 2 GPUs.
    line = _fail(["--rate", "1", "--model", "llama-3.1-70b", "--gpus", "l40s:16", "--gpus-per-node", "2"], capsys)
    assert "do not fit at any TP" in line and "L40S x 2" in line, line


def test_too_few_gpus_says_what_rate_they_carry(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(["--rate", "400", "--gpus", "h100:2"], capsys)
    m = re.search(r"too few GPUs for the rate: 2 x H100-SXM carry at most ([0-9.e+]+) sessions/s", line)
    assert m, line
    assert 1 < float(m.group(1)) < 400 and "asked 400 sessions/s" in line


@pytest.mark.parametrize("gpus", ["h100", "h100:0", "nosuchgpu:4"])
def test_bad_inventory_is_one_line(gpus: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(["--rate", "1", "--gpus", gpus], capsys)
    assert "--gpus" in line
