"""Heterogeneous inventories (``--gpus h100:4,h20:4``) through `sim compare`, specs and `up`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import build_parser, main
from tokenomy.cli.up_cmd import spec_from_args as up_spec
from tokenomy.emulator.cluster import expand
from tokenomy.experiment import load_spec
from tokenomy.perf.inventory import parse_gpus, role_pools


def test_inventory_parses_counts_and_tp_and_puts_the_compute_rich_type_on_prefill() -> None:
    pools = parse_gpus("h20:8@tp2,h100:4", default_tp=4)
    assert [(p.gpu, p.gpus, p.tp, p.instances) for p in pools] == [("h20", 8, 2, 4), ("h100", 4, 4, 1)]
    prefill, decode = role_pools(pools)
    assert (prefill.gpu, decode.gpu) == ("h100", "h20")


@pytest.mark.parametrize("text", ["h100", "h100:3@tp2", "nope:4", "h100:4,h100:4", "h100:-1"])
def test_bad_inventories_fail_with_one_line(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_gpus(text)
    assert "\n" not in str(err.value)


def test_sim_compare_on_a_mixed_inventory_runs_every_deployment_on_the_same_gpus(tmp_path: Path) -> None:
    out, saved = tmp_path / "c.json", tmp_path / "spec.yaml"
    rc = main(["sim", "compare", "--workload", "toolbench", "--duration", "4", "--gpus", "h100:2,h20:2",
               "--gpus-per-node", "8", "--deployments", "colocated,disagg,ampd", "--rates", "1", "--workers", "1",
               "--json", str(out), "--save-spec", str(saved), "--quiet"])
    assert rc == 0
    payload = json.loads(out.read_text())
    runs = {name: d for name, d in payload["deployments"].items()}
    assert runs["ampd"]["split"] == {"prefill": 2, "decode": 2}
    assert runs["disagg"]["split"] == {"prefill": 2, "decode": 2}
    assert payload["spec"]["cluster"]["gpus"] == "h100:2@tp1,h20:2@tp1"
    # the same spec file round-trips the inventory
    spec = load_spec(saved)
    assert spec.cluster.gpus == "h100:2@tp1,h20:2@tp1" and spec.cluster.instances == 4
    config = spec.sim_config(spec.deployments[0], None)
    assert config.mixed_pools == (("h100", 1, 2), ("h20", 1, 2))
    ampd = spec.sim_config(spec.deployments[2], (2, 2))
    assert (ampd.prefill_gpu, ampd.decode_gpu) == ("h100", "h20")


def test_a_pinned_split_against_the_inventory_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # prefill runs on the compute-rich type only: 3 prefill instances of 2 H100s cannot be
    assert main(["sim", "compare", "--workload", "toolbench", "--gpus", "h100:2,h20:2", "--rates", "1",
                 "--deployments", "ampd@3:1"]) == 2
    assert "prefill instances are 1 to 2 of the compute-rich type" in capsys.readouterr().err


def test_up_runs_each_role_on_its_own_gpu_and_tp() -> None:
    args = build_parser().parse_args(["up", "--prefill", "1", "--decode", "2", "--prefill-gpu", "h100",
                                      "--prefill-tp", "2", "--decode-gpu", "h20"])
    insts = expand(up_spec(args), 9000)
    assert [(i.role, i.gpu, i.tp) for i in insts] == [("prefill", "h100", 2), ("decode", "h20", 1),
                                                      ("decode", "h20", 1)]
