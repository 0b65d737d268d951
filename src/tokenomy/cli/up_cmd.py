"""``tokenomy up [cluster.yaml]``: a local cluster, one process per instance: our emulator, or
real vLLM with ``--engine vllm`` (``kind: vllm`` in the file; docs/vllm.md).

Prints each instance's URL once every ``/health`` answers (``--json`` writes the list for
scripts), and stops every instance on Ctrl-C or SIGTERM: exit status 0 once the cluster was ready,
130 when the signal came while it started (also while an instance was being forked: the launcher
holds the signal until the child is registered, so it is stopped too). Children also get SIGTERM
if this process dies (Linux parent-death signal), so none is left behind.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tokenomy.cli.common import CLIError
from tokenomy.cli.up_fleet import FleetSpec, LocalFleet, split_fleet
from tokenomy.emulator.cluster import DEFAULT_CLUSTER, ClusterSpec, Instance, Pool, expand, load_cluster
from tokenomy.emulator.launcher import Interrupts, Launch, LaunchError, LocalCluster, emulator_launch

INTERRUPTED = 130


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start a local emulated cluster (default: 4 mixed Llama-3.1-8B/H100 instances)")
    p.add_argument("cluster", nargs="?", type=Path, default=None, help="cluster YAML (see docs/emulator.md)")
    p.add_argument("--instances", type=int, default=None, help="mixed instances (no cluster file)")
    p.add_argument("--prefill", type=int, default=None, help="prefill instances (no cluster file)")
    p.add_argument("--decode", type=int, default=None, help="decode instances (no cluster file)")
    p.add_argument("--model", default=None, help="overrides the file's model")
    p.add_argument("--gpu", default=None, help="overrides the file's GPU")
    p.add_argument("--tp", type=int, default=None)
    for role in ("prefill", "decode"):  # heterogeneous pools: each role on its own GPU type and TP
        p.add_argument(f"--{role}-gpu", default=None, help=f"GPU of the {role} instances (no cluster file)")
        p.add_argument(f"--{role}-tp", type=int, default=None, help=f"TP of the {role} instances (no cluster file)")
    p.add_argument("--host", default=None)
    p.add_argument("--port-base", type=int, default=None, help="instance i listens on port-base + i (default 8100)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=None, help="wall seconds per modelled second")
    p.add_argument("--json", default=None, help="write the instance list here once all are ready ('-': stdout)")
    p.add_argument("--ready-timeout", type=float, default=None,
                   help="seconds to wait for every /health (default 60; 900 with --engine vllm)")
    v = p.add_argument_group("real vLLM (--engine vllm; docs/vllm.md)")
    v.add_argument("--engine", choices=["emulator", "vllm"], default=None, help="what each instance runs")
    v.add_argument("--vllm-python", default=None, help="Python of a vLLM install (default: $TOKENOMY_VLLM_PYTHON, "
                   "else the project's .venv-vllm from `make vllm`)")
    v.add_argument("--device", choices=["cpu", "gpu"], default=None, help="cpu: float32, KV space in GiB; gpu: vLLM's defaults")
    v.add_argument("--kv-connector", default=None,
                   help="KV connector of P/D instances (default NixlConnector when a pool is prefill/decode; 'none')")
    v.add_argument("--kv-cache-gib", type=int, default=None, help="KV cache GiB per CPU instance, whole GiB (default 2)")
    v.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="skip graph compilation (default on: starts about twice as fast)")
    v.add_argument("--run-dir", default=None, help="logs, caches and temp files, a folder per instance (default out/up)")
    v.add_argument("--vllm-arg", action="append", default=None, metavar="ARG",
                   help="one more vLLM argument for every instance (repeat; e.g. --vllm-arg=--max-num-seqs=64)")
    p.set_defaults(func=run_up)


def _role_shape(args: argparse.Namespace, role: str) -> dict[str, Any]:
    """``--prefill-gpu``/``--prefill-tp`` (and decode's) for that role's pool."""
    if role == "mixed":
        return {}
    shape = {"gpu": getattr(args, f"{role}_gpu", None), "tp": getattr(args, f"{role}_tp", None)}
    return {k: v for k, v in shape.items() if v is not None}


def fleet_of(path: Path | None) -> FleetSpec | None:
    """The cluster file's ``fleet:`` section (gateway replicas, Redis, PostgreSQL), if any."""
    if path is None or not Path(path).exists():
        return None
    data = yaml.safe_load(Path(path).read_text()) or {}
    try:
        return split_fleet(data)[1] if isinstance(data, dict) else None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{path}: fleet.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    shape = args.instances is not None or args.prefill is not None or args.decode is not None
    if args.cluster is not None:
        if shape or any(getattr(args, f"{r}_{k}", None) is not None for r in ("prefill", "decode") for k in ("gpu", "tp")):
            raise CLIError("--instances/--prefill/--decode and per-role --*-gpu/--*-tp cannot be combined "
                           "with a cluster file (give pools their gpu and tp there)")
        spec = load_cluster(args.cluster, ignore=("fleet",))
    elif shape:
        pools = [Pool.model_validate({"role": role, "count": n, **_role_shape(args, role)}) for role, n in
                 (("mixed", args.instances), ("prefill", args.prefill), ("decode", args.decode)) if n]
        if not pools or any(n is not None and n < 0 for n in (args.instances, args.prefill, args.decode)):
            raise CLIError("--instances/--prefill/--decode must leave at least one instance and none negative")
        spec = ClusterSpec(pools=pools)
    else:
        spec = DEFAULT_CLUSTER
    update: dict[str, Any] = {k: v for k, v in
                              (("model", args.model), ("gpu", args.gpu), ("tp", args.tp), ("host", args.host))
                              if v is not None}
    if args.engine is not None:
        update["kind"] = args.engine
    engine = dict(spec.engine)
    for key in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "time_scale"):
        if getattr(args, key) is not None:
            engine[key] = getattr(args, key)
    vllm = {k: v for k, v in (("python", args.vllm_python), ("device", args.device),
                              ("kv_connector", args.kv_connector), ("kv_cache_gib", args.kv_cache_gib),
                              ("enforce_eager", args.enforce_eager), ("run_dir", args.run_dir)) if v is not None}
    if args.vllm_arg:
        vllm["args"] = [*spec.vllm.args, *args.vllm_arg]
    if vllm and update.get("kind", spec.kind) != "vllm":
        raise CLIError("--vllm-python/--device/--kv-connector/--kv-cache-gib/--enforce-eager/--run-dir/--vllm-arg "
                       "need --engine vllm (or kind: vllm in the cluster file)")
    if "time_scale" in engine and update.get("kind", spec.kind) == "vllm":
        raise CLIError("--time-scale is the emulator's; real vLLM runs at its own speed")
    out = spec.model_copy(update={**update, "engine": engine, "vllm": spec.vllm.model_copy(update=vllm)})
    return ClusterSpec.model_validate(out.model_dump())  # the overrides are checked like the file


def listing(instances: list[Instance], kind: str = "emulator") -> dict[str, Any]:
    return {"instances": [{"id": i.instance_id, "role": i.role, "url": i.url, "host": i.host, "port": i.port,
                           "model": i.model, "gpu": i.gpu, "tp": i.tp, "engine": kind} for i in instances]}


def run_up(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    instances = expand(spec, args.port_base)
    launch: Callable[[Instance], Launch] = emulator_launch
    shown = instances
    if spec.kind == "vllm":
        from tokenomy.vllm.launch import served_name, vllm_launcher

        launch = vllm_launcher(spec)
        shown = [i.model_copy(update={"model": served_name(i.model, i.engine)}) for i in instances]
    ready_timeout = args.ready_timeout if args.ready_timeout is not None else (900.0 if spec.kind == "vllm" else 60.0)
    if args.json not in (None, "-") and not Path(args.json).resolve().parent.is_dir():
        raise CLIError(f"--json {args.json}: no such directory")
    interrupts = Interrupts()  # SIGINT/SIGTERM: KeyboardInterrupt here, held while a child is forked
    stop = interrupts.stop
    cluster = LocalCluster(instances, ready_timeout_s=ready_timeout, launch=launch, interrupts=interrupts)
    fleet_spec = fleet_of(args.cluster)
    fleet = None if fleet_spec is None else LocalFleet(fleet_spec, instances)
    table = sys.stderr if args.json == "-" else sys.stdout  # keep stdout pure JSON for scripts
    t0 = time.monotonic()
    ready = False
    try:
        interrupts.install()
        cluster.start()
        try:
            cluster.wait_ready()
        except LaunchError as exc:
            raise CLIError(str(exc)) from None
        for inst, spec_i in zip(shown, cluster.launches, strict=True):
            where = f"vLLM, log {spec_i.log_path}" if spec.kind == "vllm" else f"on {inst.gpu} x{inst.tp}"
            print(f"{inst.role:8s} {inst.instance_id:12s} {inst.url}  ({inst.model} {where})", file=table, flush=True)
        gateways = [] if fleet is None else [r.url for r in fleet.start()]
        for url in gateways:
            print(f"gateway  replica      {url}  (one Redis and one PostgreSQL shared)", file=table, flush=True)
        payload = json.dumps({**listing(shown, spec.kind), **({"gateways": gateways} if fleet is not None else {})})
        if args.json == "-":
            print(payload, flush=True)
        elif args.json:
            tmp = Path(args.json + ".tmp")
            tmp.write_text(payload)
            tmp.replace(args.json)  # appears whole: scripts may poll for the file
        print(f"tokenomy up: {len(instances)} instance(s) ready in {time.monotonic() - t0:.0f}s; Ctrl-C to stop",
              file=sys.stderr, flush=True)
        ready = True
        while not stop.wait(0.5):
            if fleet is not None and fleet.dead():
                print(f"tokenomy up: gateway replica {fleet.dead()[0].url} exited; stopping", file=sys.stderr, flush=True)
                return 1
            dead = cluster.dead()
            if dead:
                inst, rc = dead[0]
                print(f"tokenomy up: instance {inst.instance_id} exited with status {rc}; stopping",
                      file=sys.stderr, flush=True)
                return 1
        return 0
    except KeyboardInterrupt:
        if ready:
            return 0  # the way it ends
        print("tokenomy up: interrupted while starting; stopping the instances", file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        if fleet is not None:
            fleet.stop()
        cluster.stop()  # a signal meanwhile does not cut it short
        interrupts.restore()


def standalone(argv: list[str]) -> int:
    """``python -m tokenomy.cli.up_cmd ARGS``: ``tokenomy up ARGS`` without loading the other commands
    (scripts and tests that start clusters often)."""
    parser = argparse.ArgumentParser(prog="tokenomy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["up", *argv])
    try:
        return int(args.func(args) or 0)
    except (CLIError, ValueError, KeyError, FileNotFoundError) as exc:
        print(f"tokenomy up: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(standalone(sys.argv[1:]))
