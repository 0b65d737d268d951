"""AMPD live versus simulated: the same GAIA-like workload through ``tokenomy sim`` and through
``tokenomy bench`` -> ``tokenomy serve`` (routing.mode ampd, disagg, colocated) -> ``tokenomy up``.

Scaled to fit 2 CPU cores (documented defaults): 3 Llama-3.1-8B / H100 instances (1 prefill +
2 decode for ampd and disagg, 3 mixed for colocated), GAIA at ``--rate`` sessions/s over
``--duration`` s of arrivals. The decode pool chunks prefills at ``local_budget + max_num_seqs``
tokens in both runs, as the simulator's AMPD decode engines do. Writes
``{"sim": {mode: attainment}, "live": {mode: attainment}, "config": ...}``.

    python benchmarks/ampd_live.py --json out/ampd_live.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _emulated import _stop, cluster, free_port

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import SLO, Session
from tokenomy.gateway.keys import new_api_key
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant
from tokenomy.workload.registry import load_workload

MODES = ("ampd", "disagg", "colocated")
LOCAL_BUDGET = 512  # the simulator's AMPD default (SimConfig.ampd.placement_config)
DECODE_SEQS = 512


def sim_config(mode: str, args: argparse.Namespace) -> SimConfig:
    base = SimConfig(model=args.model, gpu=args.gpu, instances=3, prefill=1, decode=2,
                     gpu_memory_utilization=args.gpu_memory_utilization, router="session_affinity")
    return make_variant(mode, base)


def simulated(sessions: list[Session], args: argparse.Namespace, slo: SLO) -> dict[str, float | None]:
    return {m: simulate(sessions, sim_config(m, args), slo).summary.slo_attainment for m in MODES}


def _up_args(mode: str, args: argparse.Namespace, tmp: Path) -> list[str]:
    engine = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": args.max_model_len}
    if mode == "colocated":
        pools = [{"role": "mixed", "count": 3}]
    else:
        pools = [{"role": "prefill", "count": 1},
                 {"role": "decode", "count": 2,
                  "engine": {"max_num_seqs": DECODE_SEQS, "max_num_batched_tokens": LOCAL_BUDGET + DECODE_SEQS}}]
    spec = tmp / f"{mode}-cluster.json"  # YAML is a superset of JSON
    spec.write_text(json.dumps({"model": args.model, "gpu": args.gpu, "engine": engine, "pools": pools}))
    return [str(spec)]


def live_mode(mode: str, sessions: list[Session], args: argparse.Namespace, slo: SLO
              ) -> tuple[float | None, dict[str, Any]]:
    """Attainment of ``mode`` live, and the bench's errors (count and first message by status)."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with cluster(_up_args(mode, args, tmp)) as urls:
            ids = ["mixed-0", "mixed-1", "mixed-2"] if mode == "colocated" else ["prefill-0", "decode-0", "decode-1"]
            key, port = new_api_key(), free_port()
            cfg = tmp / "gateway.yaml"
            cfg.write_text(json.dumps({
                "server": {"port": port},
                "backends": [{"id": i, "url": u, "role": i.split("-")[0], "models": [args.model]}
                             for i, u in zip(ids, urls, strict=True)],
                "router": {"name": "session_affinity"},
                "routing": {"mode": mode, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
                            "perf": {"model": args.model, "gpu": args.gpu},
                            "ampd": {"local_budget_tokens": LOCAL_BUDGET}},
                "ledger": {"url": f"sqlite:///{tmp}/ledger.db"},
                "ops": {"server_secret": "ampd-live-bench-0123", "reservations": "memory", "tenants": [
                    {"org": "o", "teams": [{"name": "t", "keys": [{"name": "bench", "key": key}]}]}]},
            }))
            gw = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg),
                                   "--log-level", "warning"], cwd=tmp)
            url = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 60
                while True:
                    if gw.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"tokenomy serve did not start (status {gw.poll()})")
                    try:
                        if httpx.get(url + "/health", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.3)
                rep = run_bench(sessions, BenchConfig(targets=(url,), model=args.model, api="completions",
                                                      api_key=key, slo=slo, gpus=3, seed=args.seed))
            finally:
                _stop(gw)
    errors = {"by_status": rep.errors_by_status, "examples": rep.extras.get("error_examples", {})}
    if rep.errors_by_status:
        print(f"{mode}: errors {errors}", file=sys.stderr)
    return rep.summary.slo_attainment, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=0.2, help="GAIA sessions per second")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of session arrivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="small KV, so memory matters")
    ap.add_argument("--max-model-len", type=int, default=131072)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--slo-ttft", type=float, default=SLO().ttft_s)
    ap.add_argument("--slo-tpot", type=float, default=SLO().tpot_s)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"ampd_live: --modes: unknown mode {bad[0]!r} (known: {', '.join(MODES)})", file=sys.stderr)
        return 2
    slo = SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)
    sessions = load_workload("gaia", rate_per_s=args.rate, duration_s=args.duration, seed=args.seed)
    print(f"gaia: {len(sessions)} sessions, {sum(len(s.turns) for s in sessions)} turns", flush=True)
    if not sessions:
        print("ampd_live: the workload has no sessions: raise --rate or --duration", file=sys.stderr)
        return 2
    sim = {m: a for m, a in simulated(sessions, args, slo).items() if m in modes}
    print(f"sim attainment: {sim}", flush=True)
    live: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    for m in modes:
        live[m], errors[m] = live_mode(m, sessions, args, slo)
        print(f"live {m}: {live[m]}", flush=True)
    out = {"sim": sim, "live": live, "diff": {m: None if live[m] is None or sim[m] is None else live[m] - sim[m]
                                               for m in modes},
           "live_errors": errors, "config": {k: str(v) for k, v in vars(args).items()}}
    print(json.dumps(out))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
