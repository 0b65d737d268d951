"""``tokenomy up --engine vllm`` without starting vLLM: the command line, environment and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main
from tokenomy.emulator.cluster import ClusterSpec, Pool, VllmSection, expand, load_cluster
from tokenomy.emulator.launcher import ephemeral_ports
from tokenomy.vllm.launch import VLLM_PYTHON_ENV, find_vllm_python, vllm_launcher


def _spec(tmp_path: Path, **vllm: object) -> ClusterSpec:
    (tmp_path / "tiny").mkdir(exist_ok=True)
    python = tmp_path / "python"
    python.write_text("")
    return ClusterSpec(kind="vllm", model=str(tmp_path / "tiny"), engine={"max_num_seqs": 8, "enable_chunked_prefill": False},
                       vllm=VllmSection(python=str(python), run_dir=str(tmp_path / "run"), **vllm),  # type: ignore[arg-type]
                       pools=[Pool(role="prefill"), Pool(role="decode", count=2)])


def test_pd_instances_on_cpu_get_nixl_float32_and_their_own_folders(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    insts = expand(spec, 9100)
    launch = vllm_launcher(spec)
    runs = [launch(i) for i in insts]
    argv = runs[0].argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--served-model-name") + 1] == "tiny"  # the folder's name
    assert argv[argv.index("--port") + 1] == "9100" and "--enable-prompt-tokens-details" in argv
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    assert argv[argv.index("--max-num-seqs") + 1] == "8" and "--no-enable-chunked-prefill" in argv
    env = runs[1].env
    assert env is not None
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    folder = tmp_path / "run" / "decode-0"
    assert env["VLLM_CACHE_ROOT"].startswith(str(folder)) and env["TMPDIR"] == str(folder / "tmp")
    assert runs[1].log_path == folder / "vllm.log" and runs[1].own_group
    side = {int(r.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for r in runs if r.env}
    assert len(side) == 3  # one NIXL side channel per instance
    # vLLM binds it only after loading the model: never a port the kernel may hand out meanwhile
    # (a fresh-clone run lost an instance to "Address already in use" on one from bind(0))
    low, _ = ephemeral_ports()
    assert all(p < low for p in side) and not side & {i.port for i in insts}


def test_mixed_gpu_cluster_gets_no_connector_and_vllm_defaults(tmp_path: Path) -> None:
    spec = _spec(tmp_path, device="gpu", enforce_eager=False, args=["--gpu-memory-utilization", "0.8"])
    spec = spec.model_copy(update={"pools": [Pool(role="mixed", count=1)], "tp": 2})
    (run,) = [vllm_launcher(spec)(i) for i in expand(spec, 9100)]
    assert "--kv-transfer-config" not in run.argv and "--dtype" not in run.argv
    assert "--enforce-eager" not in run.argv and run.argv[-2:] == ["--gpu-memory-utilization", "0.8"]
    assert run.argv[run.argv.index("--tensor-parallel-size") + 1] == "2"
    assert run.env is not None and "VLLM_CPU_KVCACHE_SPACE" not in run.env


def test_vllm_python_comes_from_the_flag_then_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    py = tmp_path / "py"
    py.write_text("")
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(py))
    assert find_vllm_python() == str(py)
    with pytest.raises(ValueError, match="no such file"):
        find_vllm_python(str(tmp_path / "nope"))


def test_cluster_file_with_kind_vllm(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("kind: vllm\nmodel: m\nvllm: {device: gpu, kv_connector: none}\npools: [{role: decode}]\n")
    spec = load_cluster(f)
    assert spec.kind == "vllm" and spec.vllm.device == "gpu" and spec.vllm.kv_connector == "none"
    f.write_text("kind: vllm\nvllm: {device: tpu}\npools: [{role: decode}]\n")
    with pytest.raises(ValueError, match="vllm.device"):
        load_cluster(f)


@pytest.mark.parametrize(("argv", "message"), [
    (["--instances", "1", "--vllm-python", "/x"], "need --engine vllm"),
    (["--instances", "1", "--engine", "vllm"], "needs --model"),
    (["--instances", "1", "--engine", "vllm", "--model", "m", "--time-scale", "0.1"], "emulator's"),
    (["--instances", "1", "--engine", "vllm", "--model", "m", "--vllm-python", "/no/such/python"], "no such file"),
    (["--instances", "1", "--engine", "vllm", "--model", "m", "--kv-cache-gib", "0"], "kv_cache_gib"),
])
def test_bad_vllm_flags_are_one_line_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
