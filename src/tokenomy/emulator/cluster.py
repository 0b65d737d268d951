"""The cluster file of ``tokenomy up``: pools of emulated instances (pydantic schema).

```yaml
model: llama-3.1-8b        # defaults for every pool
gpu: h100
tp: 1
host: 127.0.0.1
port_base: 8100            # instance i listens on port_base + i, in pool order
engine:                    # engine/server flags of tokenomy emulate, underscores for dashes
  max_num_seqs: 256
pools:
  - role: prefill          # mixed | prefill | decode
    count: 1
  - role: decode
    count: 3
    engine: {max_num_seqs: 512}   # a pool may override model, gpu, tp and engine keys
```

Without a file, ``tokenomy up`` runs :data:`DEFAULT_CLUSTER`: 4 mixed Llama-3.1-8B instances on H100.

``kind: vllm`` starts real vLLM instead (:mod:`tokenomy.vllm.launch`): ``model`` is then a model
folder (or a Hugging Face id on a machine that may download), ``engine`` holds vLLM's own flags
(underscores for dashes) and the ``vllm`` section says how to run it (docs/vllm.md)::

    kind: vllm
    model: ./tiny              # tokenomy model tiny ./tiny
    vllm: {device: cpu, kv_cache_gib: 2, enforce_eager: true}
    pools: [{role: prefill, count: 1}, {role: decode, count: 1}]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENGINE_KEYS = frozenset({
    "max_num_batched_tokens", "max_num_seqs", "block_size", "gpu_memory_utilization", "num_gpu_blocks",
    "no_prefix_caching", "max_model_len", "link_gbps", "served_model_name", "tokenizer", "eos_mean_tokens",
    "kv_release_timeout", "time_scale", "max_lag_ms", "kv_transfer_timeout",
})
# (No ``trace_events`` here: every instance would write the same file.)
"""Keys allowed under ``engine``: the flags of ``tokenomy emulate`` (dashes as underscores)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Pool(_Strict):
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    count: int = Field(default=1, ge=1, le=64)
    model: str | None = None
    gpu: str | None = None
    tp: int | None = Field(default=None, ge=1)
    engine: dict[str, Any] = Field(default_factory=dict)


class VllmSection(_Strict):
    """How ``kind: vllm`` runs vLLM (each field has a ``tokenomy up`` flag)."""

    python: str | None = None  # vLLM's Python; else $TOKENOMY_VLLM_PYTHON, else the project's .venv-vllm
    device: Literal["cpu", "gpu"] = "cpu"  # cpu: --dtype float32 and a KV space in GiB; gpu: vLLM's defaults
    kv_connector: str | None = None  # None: NixlConnector when a pool is prefill/decode; "none": never
    kv_cache_gib: int = Field(default=2, ge=1)  # VLLM_CPU_KVCACHE_SPACE (cpu only; vLLM reads whole GiB)
    enforce_eager: bool = True  # no graph compilation: starts ~2x faster, decodes slower
    run_dir: str = "out/up"  # logs, caches and temporary files, one folder per instance
    args: list[str] = Field(default_factory=list)  # more vLLM arguments, verbatim, for every instance


class ClusterSpec(_Strict):
    kind: Literal["emulator", "vllm"] = "emulator"
    vllm: VllmSection = Field(default_factory=VllmSection)
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = Field(default=1, ge=1)
    host: str = "127.0.0.1"
    port_base: int = Field(default=8100, ge=1, le=65535)
    engine: dict[str, Any] = Field(default_factory=dict)
    pools: list[Pool] = Field(min_length=1)


DEFAULT_CLUSTER = ClusterSpec(pools=[Pool(role="mixed", count=4)])


class Instance(BaseModel):
    """One process ``tokenomy up`` starts."""

    instance_id: str
    role: str
    model: str
    gpu: str
    tp: int
    host: str
    port: int
    engine: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        """Arguments of ``python -m tokenomy.emulator`` for this instance."""
        args = ["--host", self.host, "--port", str(self.port), "--instance-id", self.instance_id,
                "--role", self.role, "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp)]
        for key, value in sorted(self.engine.items()):
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    args.append(flag)
            elif value is not None:
                args += [flag, str(value)]
        return args


def load_cluster(path: Path, ignore: tuple[str, ...] = ()) -> ClusterSpec:
    """Read and check a cluster file; ValueError naming the file and the bad key. ``ignore``: top-level
    sections another part reads (``tokenomy up``'s ``fleet:``)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    try:
        data = {k: v for k, v in (data or {}).items() if k not in ignore} if isinstance(data, dict) else data
        return ClusterSpec.model_validate(data if data is not None else {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{path}: {loc}: {err['msg']}") from None


def expand(spec: ClusterSpec, port_base: int | None = None) -> list[Instance]:
    """The instances of a cluster, in pool order, with their ports and merged engine flags."""
    base = spec.port_base if port_base is None else port_base
    out: list[Instance] = []
    counts: dict[str, int] = {}
    for pool in spec.pools:
        engine = {**spec.engine, **pool.engine}
        unknown = sorted(set(engine) - ENGINE_KEYS) if spec.kind == "emulator" else []
        if unknown:
            raise ValueError(f"unknown engine key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ENGINE_KEYS))}")
        for _ in range(pool.count):
            k = counts.get(pool.role, 0)
            counts[pool.role] = k + 1
            port = base + len(out)
            if port > 65535:
                raise ValueError(f"port_base {base} leaves no port for instance {len(out)}")
            out.append(Instance(
                instance_id=f"{pool.role}-{k}", role=pool.role, model=pool.model or spec.model,
                gpu=pool.gpu or spec.gpu, tp=pool.tp or spec.tp, host=spec.host, port=port, engine=engine,
            ))
    return out
