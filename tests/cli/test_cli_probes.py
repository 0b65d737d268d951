"""The bar-style check of issue 12: each probe a new user tried either runs whole (the valid ones)
or exits 2 with one line naming the flag or file at fault, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main
from workload.shared_data import MOONCAKE_CONV, require

DSV3_CONFIG = {
    "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 1536, "vocab_size": 129280,
    "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
}


def _line(row: dict[str, object]) -> str:
    return json.dumps(row) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("probes")
    (d / "huge.jsonl").write_text(_line({"session_id": "a", "turn": 0, "arrival_s": 0, "input_tokens": 10_000_000,
                                         "output_tokens": 10}))
    (d / "badjson.jsonl").write_text("{not json\n")
    (d / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (d / "hashids.jsonl").write_text("".join(
        _line({"session_id": f"s{i}", "turn": 0, "arrival_s": i, "input_tokens": 600, "output_tokens": 10,
               "hash_ids": [1, 2]}) for i in range(3)))
    (d / "notsafetensors.bin").write_bytes(b"hello world")
    (d / "dsv3").mkdir()
    (d / "dsv3" / "config.json").write_text(json.dumps(DSV3_CONFIG))
    return d


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "error:" in lines[0], err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["sim", "--rate", "1e9", "--quiet"], "--rate"),
        (["sim", "--rate", "1e5", "--quiet"], "--rate"),
        (["sim", "compare", "--rates", "1,5000", "--quiet"], "--rate 5000"),
        (["sim", "compare", "--rates", "1", "--deployments", "ampd", "--splits", "auto", "--instances", "1"],
         "2 instances"),
        (["sim", "compare", "--rates", "1", "--deployments", ""], "--deployments"),
        (["sim", "--workload", "{d}/badjson.jsonl", "--quiet"], "badjson.jsonl:1"),
        (["sim", "--workload", "{d}/binary.jsonl", "--quiet"], "binary.jsonl:1"),
        (["sim", "--workload", "{d}/hashids.jsonl", "--format", "mooncake", "--quiet"], "read as mooncake"),
        (["sim", "--deployments", "ampd@3:3", "--instances", "8", "--quiet"], "a split never changes the GPU count"),
        (["sim", "--prefill", "2", "--decode", "2", "--instances", "8", "--quiet"], "--prefill 2 + --decode 2"),
        (["eaas", "serve", "--bind", "garbage", "--experts", "0-1"], "--bind garbage"),
        (["eaas", "serve", "--bind", "tcp://127.0.0.1:99999", "--experts", "0-1"], "--bind"),
        (["eaas", "serve", "--weights", "{d}/notsafetensors.bin", "--experts", "0-1"], "--weights"),
        (["perf", "show", "--model", "deepseek-v3", "--gpu", "l40s"], "short by"),
        (["sim", "--spec", "{d}/badjson.jsonl", "--quiet"], "--spec"),
        (["sim", "--rate", "-1", "--quiet"], "--rate"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv: list[str], names: str, files: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_exit_2([a.replace("{d}", str(files)) for a in argv], capsys)
    assert names in line


def test_a_request_larger_than_any_kv_is_rejected_not_averaged(files: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "huge.json"
    assert main(["sim", "--workload", str(files / "huge.jsonl"), "--rate", "0", "--deployment", "colocated",
                 "--quiet", "--json", str(out)]) == 0
    d = json.loads(out.read_text())["deployments"]["colocated"]
    assert (d["requests"], d["rejected"], d["finished"]) == (1, 1, 0)
    assert d["tpm"] == d["rpm"] == d["goodput_rps"] == d["cost_usd"] == d["duration_s"] == 0
    assert d["cost_per_mtok_usd"] is None and d["slo_attainment"] == 0
    assert "rejected: 1 request" in capsys.readouterr().out


def test_a_session_file_with_hash_ids_is_read_as_sessions(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--workload", str(files / "hashids.jsonl"), "--deployment", "colocated", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "[sessions, detected]" in out and "3 of 3 requests" in out


@pytest.mark.slow  # about 40 s of CPU: 200,000 simulated requests
@pytest.mark.timeout(900)  # generous on a loaded machine
def test_session_file_replays_whole_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """200,000 one-turn sessions over 2,000 s: all of them run (no rescale to 1/s, no cut at 120 s)."""
    n = 200_000
    path = tmp_path / "big.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            fh.write(f'{{"session_id":"s{i}","turn":0,"arrival_s":{i * 0.01:.2f},"input_tokens":{16 + i % 16},'
                     f'"output_tokens":2}}\n')
    out = tmp_path / "big.json"
    assert main(["sim", "--workload", str(path), "--deployment", "colocated", "--instances", "1", "--quiet",
                 "--json", str(out)]) == 0
    assert "200,000 of 200,000 requests" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert payload["deployments"]["colocated"]["requests"] == n
    assert payload["workload"]["requests"] == n and payload["spec"]["workload"]["rate_per_s"] is None


def test_rate_and_duration_apply_to_files_when_given_and_say_so(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(_line({"session_id": f"s{i}", "turn": 0, "arrival_s": float(i), "input_tokens": 20,
                                   "output_tokens": 2}) for i in range(50)))
    assert main(["sim", "--workload", str(path), "--rate", "2", "--duration", "10", "--deployment", "colocated",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "20 of 50 requests" in out and "rescaled from 1 to 2 sessions/s" in out and "cut 30 of 50" in out


@pytest.mark.slow  # about 11 s of CPU on an idle core
@pytest.mark.timeout(900)
def test_the_mooncake_trace_replays_all_12031_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.json"
    assert main(["sim", "--workload", str(require(MOONCAKE_CONV)), "--deployment", "colocated", "--quiet",
                 "--json", str(out)]) == 0
    assert "12,031 of 12,031 requests" in capsys.readouterr().out
    assert json.loads(out.read_text())["deployments"]["colocated"]["requests"] == 12_031


def test_hf_config_paths_and_fp8_weights(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(files / "dsv3" / "config.json")
    assert main(["perf", "show", "--model", config, "--gpu", "h200", "--tp", "8"]) == 0
    assert "671.0 GB (8-bit)" in capsys.readouterr().out
    assert main(["perf", "show", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8"]) == 0
    assert "671.0 GB (8-bit)" in capsys.readouterr().out
    assert main(["sim", "--model", config, "--gpu", "h200", "--tp", "8", "--instances", "1", "--workload", "chat",
                 "--duration", "3", "--deployment", "colocated", "--quiet"]) == 0


def test_gpu_yaml_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = tmp_path / "cheap.yaml"
    gpu.write_text("name: h100\nusd_per_gpu_hour: 1.0\n")
    assert main(["perf", "show", "--model", "llama-3.1-8b", "--gpu", str(gpu)]) == 0
    gpu.write_text("name: h100\nwarp_speed: 9\n")
    assert "unknown fields" in _one_line_exit_2(["perf", "show", "--model", "llama-3.1-8b", "--gpu", str(gpu)],
                                                capsys)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("tokenomy ")
