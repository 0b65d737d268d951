"""Simulator speed: simulated output tokens per CPU second, this tree beside a baseline commit.

Two runs, each replayed ``--repeats`` times:

* ``mooncake``: the Mooncake conversation trace (12,031 requests) on its own clock, 8 colocated
  Llama-3.1-8B / H100 instances, prefix-aware router;
* ``gaia_ampd``: the GAIA-like agent workload (3 sessions/s for 120 s, seed 0) under AMPD with its
  default split (4:4) on 8 H100s in one node, SLO 2 s / 100 ms: the policy-heavy run.

Each replay runs in its own process (``--worker``), timed with ``time.process_time`` around
``simulate`` only (the machine is shared: wall time is not cost). With ``--baseline COMMIT`` the same
replays run on that commit's ``src`` (a detached git worktree, made once under ``--baseline-dir``),
alternating with this tree's, so drifting load on the machine hits both alike; the headline is the
median of each side and their ratio. The two sides must simulate the same tokens (checked).
``--paired`` runs each repeat's two replays at once, one per core, and adds the geometric mean of
the per-pair ratios (``pair_ratio_geomean``): on a shared machine whose speed drifts by 15-40%
within minutes, a pair sees the same drift, where replays one after the other do not.

``--instructions N`` counts instead of timing: each side replays the run's first ``N`` sessions once
under valgrind's callgrind (``apt-get install valgrind``), instrumented around ``simulate`` only, and
reports the instructions it executed and their ratio. A count does not drift with the machine's
load (a paired replay's ratio moves by 10% from one minute to the next here), so a change of a few
percent is measured in one run; it does not see cache misses, which CPU time does.

This tree runs its compiled core when it is built (``make install``; ``core`` in the JSON says
``native``); ``TOKENOMY_PURE=1`` in the environment times its Python sources instead. A baseline
worktree has no build: it runs its sources (``baseline_core``).

    python benchmarks/sim_speed.py --baseline 1728e6a --json out/sim_speed.json
    python benchmarks/sim_speed.py --runs gaia_ampd --repeats 1          # this tree only, one run
    python benchmarks/sim_speed.py --baseline 1728e6a --paired --repeats 5 --json out/sim_speed_paired.json
    python benchmarks/sim_speed.py --baseline HEAD~1 --instructions 1500 --runs mooncake   # a change's effect
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"
RUNS = ("mooncake", "gaia_ampd")
BASELINE_AMPD = "ampd-bank-turn"
"""1728e6a's name for today's default ``ampd`` (the variants were reduced to one default since; see
``tests/sim/test_identical_results.py``)."""


def _simulate(run: str, trace: Path, ampd: str, first: int | None = None, callgrind: bool = False) -> dict[str, Any]:
    """One replay in this process, on whichever ``tokenomy`` is first on the path (``ampd``: the
    name that tree gives the default AMPD deployment; ``first``: only the first sessions;
    ``callgrind``: running under callgrind, whose instrumentation is turned on around ``simulate``)."""
    import time

    from tokenomy.core import SLO
    from tokenomy.experiment.jobs import load_sessions
    from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec
    from tokenomy.sim import SimConfig, simulate
    from tokenomy.workload.registry import load_workload

    if run == "mooncake":
        sessions = load_workload(str(trace), rate_per_s=0.0, duration_s=math.inf, seed=0)
        config, slo = SimConfig(deployment="colocated", model="llama-3.1-8b", gpu="h100", instances=8), SLO()
    else:
        dep = DeploymentSpec(ampd)
        spec = ExperimentSpec(workload=WorkloadSpec("gaia", rate_per_s=3.0, duration_s=120.0, seed=0),
                              cluster=ClusterSpec(gpus="h100:8", gpus_per_node=8), deployments=(dep,),
                              slo=SLO(2.0, 0.1))
        sessions = load_sessions(spec)[0]
        config, slo = spec.sim_config(dep, spec.splits_of(dep)[0]), spec.slo
    import tokenomy

    if first is not None:
        sessions = sessions[:first]
    if callgrind:
        _instrument("on")
    cpu0 = time.process_time()
    result = simulate(sessions, config, slo)
    cpu = time.process_time() - cpu0
    if callgrind:
        _instrument("off")
    return {"cpu_s": cpu, "output_tokens": result.output_tokens, "requests": len(result.records),
            "events": result.events, "slo_attainment": result.summary.slo_attainment,
            "core": getattr(tokenomy, "NATIVE", "pure")}  # compiled or Python sources (tokenomy._native)


def _instrument(state: str) -> None:
    """Turn callgrind's instrumentation of this process on or off (it returns once the process has)."""
    subprocess.run(["callgrind_control", f"--instr={state}", str(os.getpid())], check=True, capture_output=True)


def _start(src: Path, run: str, trace: Path, ampd: str = "ampd", first: int | None = None) -> subprocess.Popen[str]:
    """A replay's worker process; with ``first`` (``--instructions``), the first sessions under callgrind."""
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, __file__, "--worker", run, "--trace", str(trace), "--ampd", ampd]
    if first is not None:
        cmd = [*CALLGRIND, *cmd, "--first", str(first), "--callgrind"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


CALLGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null"]


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"replay failed ({proc.returncode}): {err.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out)
    counted = re.search(r"Collected : (\d+)", err)  # callgrind's summary, on stderr
    if counted:
        result["instructions"] = int(counted.group(1))
    return result


def _instructions(run: str, trace: Path, first: int, base_src: Path | None, base_ampd: str,
                  baseline: str | None) -> dict[str, Any]:
    """``--instructions``: both sides' first ``first`` sessions of ``run`` at once, counted."""
    procs = [_start(ROOT / "src", run, trace, first=first)]
    if base_src is not None:
        procs.append(_start(base_src, run, trace, base_ampd, first=first))
    mine, *theirs = [_result(p) for p in procs]
    entry = {"sessions": first, "output_tokens": mine["output_tokens"], "requests": mine["requests"],
             "core": mine["core"], "instructions": mine["instructions"],
             "instructions_per_out_tok": round(mine["instructions"] / max(1, mine["output_tokens"]), 1)}
    if theirs:
        base = theirs[0]
        if base["output_tokens"] != mine["output_tokens"] or base["slo_attainment"] != mine["slo_attainment"]:
            raise RuntimeError(f"{run}: this tree and {baseline} simulated different results")
        entry.update(baseline=baseline, baseline_core=base["core"], baseline_instructions=base["instructions"],
                     ratio=round(base["instructions"] / mine["instructions"], 3))
    return entry


def _replay(src: Path, run: str, trace: Path, ampd: str = "ampd") -> dict[str, Any]:
    return _result(_start(src, run, trace, ampd))


def _baseline_src(commit: str, where: Path) -> Path:
    """``src`` of ``commit`` (a directory given as is, else a detached worktree made once)."""
    if Path(commit).is_dir():
        return Path(commit) / "src"
    tree = where / f"tokenomy-{commit}"
    if not (tree / "src").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
    return tree / "src"


def _side(replays: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = replays[0]["output_tokens"]
    cpus = [r["cpu_s"] for r in replays]
    return {"output_tokens": tokens, "requests": replays[0]["requests"], "events": replays[0]["events"],
            "slo_attainment": replays[0]["slo_attainment"], "core": replays[0]["core"],
            "cpu_s_each": [round(c, 3) for c in cpus],
            "out_tok_per_cpu_s": round(tokens / statistics.median(cpus), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--baseline", default=None, help="a commit (or a checkout's directory) to compare with")
    ap.add_argument("--baseline-dir", type=Path, default=Path(tempfile.gettempdir()),
                    help="where the baseline's worktree is made (default: the temp dir)")
    ap.add_argument("--repeats", type=int, default=3, help="replays per side; the median CPU time counts")
    ap.add_argument("--paired", action="store_true",
                    help="run each repeat's two sides at once, one per core (needs 2 free cores), and also "
                         "report the geometric mean of the per-pair ratios: a drift in the machine's speed "
                         "then hits both sides of a pair alike")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--baseline-ampd", default=BASELINE_AMPD,
                    help="the baseline's name for today's default AMPD deployment (default: %(default)s, "
                         "1728e6a's name for it)")
    ap.add_argument("--instructions", type=int, default=None, metavar="N",
                    help="count instructions (callgrind) of each side's replay of the first N sessions, once, "
                         "instead of timing (needs valgrind)")
    ap.add_argument("--worker", choices=RUNS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ampd", default="ampd", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--callgrind", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_simulate(args.worker, args.trace, args.ampd, args.first, callgrind=args.callgrind)))
        return 0
    runs = args.runs.split(",")
    unknown = [r for r in runs if r not in RUNS]
    if unknown or args.repeats < 1:
        print(f"unknown run(s) {unknown} (known: {', '.join(RUNS)}) or --repeats < 1", file=sys.stderr)
        return 2
    if "mooncake" in runs and not args.trace.exists():
        print(f"trace not found: {args.trace} (pass --trace, or --runs gaia_ampd)", file=sys.stderr)
        return 2
    if args.instructions is not None and (args.instructions < 1 or not all(map(shutil.which, ("valgrind", "callgrind_control")))):
        print("--instructions needs N >= 1 and valgrind's callgrind on the PATH (Debian: apt-get install valgrind)",
              file=sys.stderr)
        return 2
    base_src = _baseline_src(args.baseline, args.baseline_dir) if args.baseline else None
    payload: dict[str, Any] = {}
    for run in runs:
        if args.instructions is not None:
            try:
                payload[run] = _instructions(run, args.trace, args.instructions, base_src, args.baseline_ampd,
                                             args.baseline)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            print(f"{run}: {json.dumps(payload[run])}", file=sys.stderr)
            continue
        mine: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        for _ in range(args.repeats):  # alternating (or, --paired, at once): a noisy minute hits both sides
            if args.paired and base_src is not None:
                procs = (_start(ROOT / "src", run, args.trace), _start(base_src, run, args.trace, args.baseline_ampd))
                mine.append(_result(procs[0]))
                theirs.append(_result(procs[1]))
                continue
            mine.append(_replay(ROOT / "src", run, args.trace))
            if base_src is not None:
                theirs.append(_replay(base_src, run, args.trace, args.baseline_ampd))
        entry = _side(mine)
        if theirs:
            base = _side(theirs)
            if base["output_tokens"] != entry["output_tokens"] or base["slo_attainment"] != entry["slo_attainment"]:
                print(f"{run}: this tree and {args.baseline} simulated different results", file=sys.stderr)
                return 1
            entry.update(baseline=args.baseline, baseline_core=base["core"], baseline_cpu_s_each=base["cpu_s_each"],
                         baseline_out_tok_per_cpu_s=base["out_tok_per_cpu_s"],
                         ratio=round(entry["out_tok_per_cpu_s"] / base["out_tok_per_cpu_s"], 3))
            if args.paired:
                pairs = [b["cpu_s"] / m["cpu_s"] for m, b in zip(mine, theirs, strict=True)]
                entry.update(pair_ratios=[round(r, 3) for r in pairs],
                             pair_ratio_geomean=round(math.exp(sum(map(math.log, pairs)) / len(pairs)), 3))
        payload[run] = entry
        print(f"{run}: {json.dumps(entry)}", file=sys.stderr)
    print(json.dumps(payload, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
