"""How many extents the block pool's calls would be: runs of consecutive block ids, and runs of
consecutive keys, per call (docs/simulator.md, "Where the time goes now").

The pool handles a call's blocks as one numpy vector of ids (``engine/block_pool.py``). A pool that
kept extents instead would do a few operations per extent. This replays one of ``sim_speed.py``'s
runs on the Python sources (``TOKENOMY_PURE=1``: the compiled pool cannot be wrapped), wraps
``release``, the reference taken on cached blocks (``_touch``: prefix hits and retention, whether
through ``touch`` or an admission's ``take``) and ``allocate_ids``, and counts per call:

* ``blocks``: the blocks the call takes, frees or references;
* ``id_runs``: runs of consecutive block ids among them (either direction: a release queues a
  request's blocks tail first);
* ``key_runs``: runs of consecutive key slots (a block without a key is a run of its own); for an
  allocation, the keys its blocks held before it evicted them, counted once no block is fresh
  (fresh blocks hold no key).

    python benchmarks/pool_extents.py --run gaia_ampd --json out/pool_extents.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ["TOKENOMY_PURE"] = "1"  # before tokenomy is imported: the sources can be wrapped

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import DEFAULT_TRACE, RUNS, _simulate  # noqa: E402

from tokenomy.engine import block_pool  # noqa: E402
from tokenomy.engine.block_ids import BlockVector  # noqa: E402


def runs_of(values: np.ndarray, valid: np.ndarray | None = None) -> int:
    """Runs of consecutive values (step +1 or -1); where ``valid`` is False a value is a run alone."""
    if len(values) == 0:
        return 0
    joined = np.abs(np.diff(values)) == 1
    if valid is not None:
        joined &= valid[1:] & valid[:-1]
    return 1 + int(np.count_nonzero(~joined))


def count(run: str, trace: Path) -> dict[str, dict[str, float | None]]:
    """Per call kind: calls, and blocks, id runs and key runs per call, on one replay."""
    totals: dict[str, list[int]] = {k: [0, 0, 0, 0, 0] for k in ("release", "touch", "allocate")}
    pool_cls = block_pool.BlockPool
    release, touch, allocate_ids = pool_cls.release, pool_cls._touch, pool_cls.allocate_ids

    def add(kind: str, ids: np.ndarray, slots: np.ndarray | None) -> None:
        t = totals[kind]
        t[0] += 1
        t[1] += len(ids)
        t[2] += runs_of(ids)
        if slots is not None:  # (calls whose keys are known, their runs of keys)
            t[3] += 1
            t[4] += runs_of(slots, slots >= 0)

    def wrapped_release(self: block_pool.BlockPool, blocks: Any) -> None:
        ids = np.asarray(blocks, dtype=np.int64)
        if len(ids):
            add("release", ids, self._key_slot[ids])
        release(self, blocks)

    def wrapped_touch(self: block_pool.BlockPool, ids: BlockVector, counts: BlockVector,
                      was_free: npt.NDArray[np.bool_], n_free: int) -> None:
        if len(ids):
            add("touch", ids, self._key_slot[ids])
        touch(self, ids, counts, was_free, n_free)

    def wrapped_allocate(self: block_pool.BlockPool, n: int, **kwargs: Any) -> np.ndarray:
        slots = None
        if n > 0 and self._fresh >= self.num_blocks:  # the queue's front: what this call evicts
            slots = self._key_slot[self._valid_entries()[:n]]
        ids: np.ndarray = allocate_ids(self, n, **kwargs)
        if n > 0:
            add("allocate", ids, slots)
        return ids

    pool_cls.release, pool_cls._touch, pool_cls.allocate_ids = (  # type: ignore[method-assign]
        wrapped_release, wrapped_touch, wrapped_allocate)
    try:
        _simulate(run, trace, "ampd")
    finally:
        pool_cls.release, pool_cls._touch, pool_cls.allocate_ids = (  # type: ignore[method-assign]
            release, touch, allocate_ids)
    return {kind: {"calls": c, "blocks_per_call": round(b / c, 1), "id_runs_per_call": round(i / c, 1),
                   "key_runs_per_call": round(k / kc, 1) if kc else None}
            for kind, (c, b, i, kc, k) in totals.items() if c}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", choices=RUNS, default="gaia_ampd")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the Mooncake trace (run mooncake)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.run == "mooncake" and not args.trace.is_file():
        ap.error(f"the Mooncake trace is not at {args.trace} (--trace)")
    out = count(args.run, args.trace)
    for kind, row in out.items():
        print(f"{args.run} {kind}: {row['calls']:,} calls, {row['blocks_per_call']:g} blocks, "
              f"{row['id_runs_per_call']:g} runs of ids, {row['key_runs_per_call']} runs of keys per call")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({args.run: out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
