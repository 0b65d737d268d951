"""``tokenomy up [cluster.yaml]``: a local emulated cluster, one process per instance.

Prints each instance's URL once every ``/health`` answers (``--json`` writes the list for
scripts), and stops every instance on Ctrl-C or SIGTERM. Children also get SIGTERM if this
process dies (Linux parent-death signal), so none is left behind.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tokenomy.cli.main import CLIError
from tokenomy.cli.up_fleet import FleetSpec, LocalFleet, split_fleet
from tokenomy.emulator.cluster import DEFAULT_CLUSTER, ClusterSpec, Instance, Pool, expand, load_cluster
from tokenomy.emulator.launcher import LaunchError, LocalCluster


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start a local emulated cluster (default: 4 mixed Llama-3.1-8B/H100 instances)")
    p.add_argument("cluster", nargs="?", type=Path, default=None, help="cluster YAML (see docs/emulator.md)")
    p.add_argument("--instances", type=int, default=None, help="mixed instances (no cluster file)")
    p.add_argument("--prefill", type=int, default=None, help="prefill instances (no cluster file)")
    p.add_argument("--decode", type=int, default=None, help="decode instances (no cluster file)")
    p.add_argument("--model", default=None, help="overrides the file's model")
    p.add_argument("--gpu", default=None, help="overrides the file's GPU")
    p.add_argument("--tp", type=int, default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port-base", type=int, default=None, help="instance i listens on port-base + i (default 8100)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=None, help="wall seconds per modelled second")
    p.add_argument("--json", default=None, help="write the instance list here once all are ready ('-': stdout)")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for every /health")
    p.set_defaults(func=run_up)


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
        if shape:
            raise CLIError("--instances/--prefill/--decode cannot be combined with a cluster file")
        spec = load_cluster(args.cluster, ignore=("fleet",))
    elif shape:
        pools = [Pool.model_validate({"role": role, "count": n}) for role, n in
                 (("mixed", args.instances), ("prefill", args.prefill), ("decode", args.decode)) if n]
        if not pools or any(n is not None and n < 0 for n in (args.instances, args.prefill, args.decode)):
            raise CLIError("--instances/--prefill/--decode must leave at least one instance and none negative")
        spec = ClusterSpec(pools=pools)
    else:
        spec = DEFAULT_CLUSTER
    update: dict[str, Any] = {k: v for k, v in
                              (("model", args.model), ("gpu", args.gpu), ("tp", args.tp), ("host", args.host))
                              if v is not None}
    engine = dict(spec.engine)
    for key in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "time_scale"):
        if getattr(args, key) is not None:
            engine[key] = getattr(args, key)
    return spec.model_copy(update={**update, "engine": engine})


def listing(instances: list[Instance]) -> dict[str, Any]:
    return {"instances": [{"id": i.instance_id, "role": i.role, "url": i.url, "host": i.host, "port": i.port,
                           "model": i.model, "gpu": i.gpu, "tp": i.tp} for i in instances]}


def run_up(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    instances = expand(spec, args.port_base)
    if args.json not in (None, "-") and not Path(args.json).resolve().parent.is_dir():
        raise CLIError(f"--json {args.json}: no such directory")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = LocalCluster(instances, ready_timeout_s=args.ready_timeout)
    fleet_spec = fleet_of(args.cluster)
    fleet = None if fleet_spec is None else LocalFleet(fleet_spec, instances)
    table = sys.stderr if args.json == "-" else sys.stdout  # keep stdout pure JSON for scripts
    try:
        cluster.start()
        try:
            cluster.wait_ready(stop)
        except LaunchError as exc:
            raise CLIError(str(exc)) from None
        for inst in instances:
            print(f"{inst.role:8s} {inst.instance_id:12s} {inst.url}  ({inst.model} on {inst.gpu} x{inst.tp})",
                  file=table, flush=True)
        gateways = [] if fleet is None else [r.url for r in fleet.start()]
        for url in gateways:
            print(f"gateway  replica      {url}  (one Redis and one PostgreSQL shared)", file=table, flush=True)
        payload = json.dumps({**listing(instances), **({"gateways": gateways} if fleet is not None else {})})
        if args.json == "-":
            print(payload, flush=True)
        elif args.json:
            tmp = Path(args.json + ".tmp")
            tmp.write_text(payload)
            tmp.replace(args.json)  # appears whole: scripts may poll for the file
        print(f"tokenomy up: {len(instances)} instance(s) ready; Ctrl-C to stop", file=sys.stderr, flush=True)
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
    finally:
        if fleet is not None:
            fleet.stop()
        cluster.stop()
        for s, h in previous.items():
            signal.signal(s, h)


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
