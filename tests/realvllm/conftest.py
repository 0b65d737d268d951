"""Real vLLM for the tests in this folder: one set of instances for the whole session.

Three vLLM CPU instances of the tiny random Llama (``tokenomy model tiny``), each with NIXL as
``kv_both``, 1 GiB of KV and ``--enforce-eager``, started together by ``tokenomy up --engine vllm``
with a cluster file: ``prefill-0``, ``decode-0`` and ``decode-1``. A test gives them the
role it needs (any of them serves requests without ``kv_transfer_params`` as a mixed instance).

Set ``TOKENOMY_TEST_VLLM_INSTANCES`` to the ``--json`` listing of a ``tokenomy up`` already running
the same cluster (model served as ``tiny``, ``max_model_len`` 4096) to reuse it instead.

vLLM comes from ``$TOKENOMY_VLLM_PYTHON`` or the project's ``.venv-vllm`` (``make vllm``; ``make
test`` builds it). Without one the tests fail under CI (``CI`` set) and are skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from realvllm_support import MODEL, need_vllm_python

from helpers.launch import stop
from helpers.ports import free_port_base
from tokenomy.emulator.launcher import port_free

REUSE_ENV = "TOKENOMY_TEST_VLLM_INSTANCES"
# The shared cluster may take up to its ready timeout (600 s) to start on a loaded 2-core machine;
# the test that first asks for it must not be cut by the suite's default 300 s per-test timeout.
CLUSTER_READY_S = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(CLUSTER_READY_S + 120))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tokenizers")
    from tokenomy.vllm.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def vllm_urls(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Instance id -> URL of the three shared vLLM instances, started by ``tokenomy up --engine vllm``
    from a cluster file; stopped (SIGTERM to ``tokenomy up``) when the session ends."""
    running = os.environ.get(REUSE_ENV)
    if running:  # a cluster already up (developers iterating): its `tokenomy up --json` listing
        yield {i["id"]: i["url"] for i in json.loads(Path(running).read_text())["instances"]}
        return
    python = need_vllm_python()
    folder = tmp_path_factory.mktemp("vllm")
    cluster = folder / "cluster.yaml"
    cluster.write_text(json.dumps({  # JSON is YAML
        "kind": "vllm", "model": str(tiny_model),
        "vllm": {"python": python, "kv_connector": "NixlConnector", "kv_cache_gib": 1, "run_dir": str(folder)},
        "engine": {"served_model_name": MODEL, "max_model_len": 4096, "max_num_seqs": 16},
        "pools": [{"role": "prefill", "count": 1}, {"role": "decode", "count": 2}],
    }))
    listing = folder / "instances.json"
    up = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.up_cmd", str(cluster), "--port-base",
                           str(free_port_base(3)), "--json", str(listing), "--ready-timeout", str(CLUSTER_READY_S)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + CLUSTER_READY_S + 20
        while not listing.exists():
            if up.poll() is not None:
                logs = "\n".join(f"{p}: {p.read_text()[-2000:]}" for p in folder.glob("*/vllm.log"))
                raise RuntimeError(f"tokenomy up --engine vllm exited with status {up.returncode}\n{logs}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tokenomy up --engine vllm: not ready in {CLUSTER_READY_S + 20} s")
            time.sleep(0.5)
        instances = json.loads(listing.read_text())["instances"]
        ports = [int(i["port"]) for i in instances]
        assert {i["engine"] for i in instances} == {"vllm"} and {i["model"] for i in instances} == {MODEL}
        yield {i["id"]: i["url"] for i in instances}
    finally:
        stop(up, timeout_s=60)
    # a clean stop: every instance's API server (and with it its engine process) is gone
    assert all(port_free("127.0.0.1", p) for p in ports), "a vLLM instance outlived tokenomy up"
