"""Decode fast-forward: many decode-only steps planned at once and applied lazily.

When no request waits and every running request decodes, an engine's next steps are determined
until a request finishes or something outside touches the engine: each step decodes the same
batch, the context grows by the batch size, and a block is taken only when a request crosses a
block boundary. :class:`DecodeRunner` plans such a *run* without applying it (durations and FLOPs
from the performance model), then applies any prefix of it on demand, with exactly the state
changes, in exactly the order, that single :meth:`Engine.step` calls would have made.

A run never contains a finishing step (it stops before the first one) nor a step that would
have to preempt (it stops before the first block allocation the free pool cannot serve), so
those steps always run through the ordinary ``step``.

A run is priced lazily too: its length (``limit``) is known at planning, but most runs are cut
before it by a request arriving, so only the first ``FIRST_PRICED`` steps are priced then, and
:meth:`DecodeRunner.extend` prices more (as many again each time) when someone reaches the priced
end. The prices, and their start times, are the same floats as a run priced whole. (64: a
Mooncake replay applies 47 steps of a run at the median, 93 on average, of the 171 it may take;
fewer priced steps cost more events, each extension being one.)
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Protocol, cast

from tokenomy.core import StepShape, StepTimeModel
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv_manager import KVManager
from tokenomy.engine.queues import RequestQueues
from tokenomy.engine.request_state import RequestState
from tokenomy.engine.results import EngineStats, StepResult


class DecodeRunModel(Protocol):
    """A performance model that prices a whole run of decode steps in one call (optional)."""

    def decode_run(self, batch: int, first_context_tokens: int, num_steps: int) -> tuple[list[float], list[float]]:
        """Per-step ``(step_time_s, step_flops)`` of decode steps whose context grows by ``batch``."""
        ...


FIRST_PRICED = 64
"""Steps of a run priced when it is planned (the rest when reached: :meth:`DecodeRunner.extend`)."""


class DecodeRun:
    """A planned run of up to ``limit`` back-to-back decode steps of one batch, ``num_steps`` of
    them priced so far.

    ``starts[j]`` is when step ``j`` starts and ``starts[j + 1]`` when it ends (each step starts
    exactly when the previous one ends, as the simulator chains them). ``applied`` steps have been
    applied to the engine so far. Step ``j`` decodes ``batch`` requests with a total context of
    ``first_context_tokens + batch * j`` tokens.
    """

    __slots__ = (
        "requests", "batch", "first_context_tokens", "starts", "durations_s", "flops", "num_steps", "applied",
        "nc0", "first_alloc", "limit", "events", "events_upto", "cursor",
    )

    def __init__(
        self, requests: list[RequestState], start_s: float, durations_s: list[float], flops: list[float], first_ctx: int,
        first_alloc: list[int], limit: int = 0,
    ) -> None:
        self.requests = requests
        self.batch = len(requests)
        self.first_context_tokens = first_ctx
        self.durations_s = durations_s
        self.flops = flops
        self.starts: list[float] = [start_s]
        _append_ends(self.starts, durations_s)
        self.num_steps = len(durations_s)
        self.limit = max(limit, self.num_steps)  # steps the run may be priced up to (DecodeRunner.extend)
        self.applied = 0
        self.nc0 = [r.num_computed for r in requests]  # before step 0
        # Step at which each request first takes a block (then every block_size steps).
        self.first_alloc = first_alloc
        # The block events of steps before ``events_upto``, sorted (DecodeRunner.apply), and the
        # first one not applied yet: made once per priced stretch, not per application.
        self.events: list[int] = []
        self.events_upto = 0
        self.cursor = 0

    @property
    def end_s(self) -> float:
        """End of the run's last priced step (of its last applied step once the run is closed)."""
        return self.starts[self.num_steps]

    @property
    def priced_all(self) -> bool:
        """Every step the run may take is priced (:meth:`DecodeRunner.extend` has nothing to add)."""
        return self.num_steps >= self.limit

    def add_steps(self, durations_s: list[float], flops: list[float]) -> None:
        """Price the steps after the last priced one (the run is open: nothing was cut off it)."""
        self.durations_s += durations_s
        self.flops += flops
        _append_ends(self.starts, durations_s)
        self.num_steps += len(durations_s)

    @property
    def next_start_s(self) -> float:
        """Start of the first step not applied yet (``end_s`` when all are applied)."""
        return self.starts[self.applied]

    def results(self, first: int, stop: int) -> list[StepResult]:
        """The :class:`StepResult` of steps ``first..stop-1``, as ``Engine.step`` would have returned them."""
        ids = [r.request_id for r in self.requests]
        b, c0 = self.batch, self.first_context_tokens
        starts, durations, flops = self.starts, self.durations_s, self.flops
        return [
            StepResult(starts[j], durations[j], StepShape(0, 0, 0.0, 0, b, c0 + b * j), flops[j], list(ids), [], [], [])
            for j in range(first, stop)
        ]


def _append_ends(starts: list[float], durations_s: list[float]) -> None:
    """Append each step's end, the last start plus its duration, one after another (a plain loop:
    compiled, it adds unboxed floats; the same additions as ``itertools.accumulate``)."""
    t = starts[-1]
    for d in durations_s:
        t += d
        starts.append(t)


def sum_in_order(values: list[float], first: int, stop: int, start: float) -> float:
    """``start + values[first] + values[first + 1] + ... + values[stop - 1]`` added left to right (what
    per-step ``+=`` gives; a plain loop: compiled, it adds unboxed floats and slices nothing)."""
    total = start
    for j in range(first, stop):
        total += values[j]
    return total


_BULK_MIN_EVENTS = 64
"""Fewer block events than this in one application: one at a time (numpy's per-call cost)."""


class DecodeRunner:
    """Plans decode runs for one engine and applies them; it shares the engine's collaborators."""

    __slots__ = ("_config", "_queues", "_kv", "_stats", "_perf", "_run_model")

    def __init__(
        self, config: EngineConfig, queues: RequestQueues, kv: KVManager, stats: EngineStats, perf: StepTimeModel
    ) -> None:
        self._config = config
        self._queues = queues
        self._kv = kv
        self._stats = stats
        self._perf = perf
        # Looked up once, by name: a runtime-checkable Protocol does not survive mypyc (tokenomy._native).
        self._run_model = cast(DecodeRunModel, perf) if callable(getattr(perf, "decode_run", None)) else None

    # ---- planning ---------------------------------------------------------------------------
    def plan(self, now: float, max_steps: int) -> DecodeRun | None:
        """The longest run (at most ``max_steps``, at least 2 steps) the engine's state allows, or None."""
        queues = self._queues
        running = queues.running
        if queues.waiting or not running or queues.num_decoding != len(running):
            return None
        if len(running) > self._config.max_num_batched_tokens:
            return None  # the token budget would leave some decodes out of a step
        bs = self._kv.block_size
        k = max_steps
        first_alloc: list[int] = []
        ctx = 0
        for r in running:
            nc = r.num_computed
            if r.output_tokens < 1 or r.num_tokens != nc + 1 or len(r.blocks) * bs < nc:
                return None  # not the steady decode state the bulk update assumes
            # Step j (0-based) finishes r when nc + j + 2 >= max_num_tokens: stop before it.
            k = min(k, r.max_num_tokens - nc - 2)
            first_alloc.append(len(r.blocks) * bs - nc)  # step at which r first needs a new block
            ctx += nc + 1
        if k < 2:
            return None
        free = self._kv.pool.num_free
        if _allocations(first_alloc, k, bs) > free:
            lo, hi = 0, k  # largest k whose allocations fit: no step of the run may preempt
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _allocations(first_alloc, mid, bs) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            if k < 2:
                return None
        durations, flops = self._price(len(running), ctx, min(k, FIRST_PRICED))
        return DecodeRun(list(running), now, durations, flops, ctx, first_alloc, k)

    def extend(self, run: DecodeRun) -> None:
        """Price the open run's next steps: as many as are priced already, up to its ``limit``."""
        n = min(run.limit - run.num_steps, run.num_steps)
        if n > 0:
            durations, flops = self._price(run.batch, run.first_context_tokens + run.batch * run.num_steps, n)
            run.add_steps(durations, flops)

    def _price(self, batch: int, ctx: int, k: int) -> tuple[list[float], list[float]]:
        """Durations and FLOPs of ``k`` decode steps of ``batch`` requests, the first reading ``ctx`` tokens."""
        if self._run_model is not None:
            return self._run_model.decode_run(batch, ctx, k)
        perf = self._perf
        shapes = [StepShape(0, 0, 0.0, 0, batch, ctx + batch * j) for j in range(k)]
        return [perf.step_time_s(s) for s in shapes], [perf.step_flops(s) for s in shapes]

    # ---- applying ---------------------------------------------------------------------------
    def apply(self, run: DecodeRun, stop: int) -> None:
        """Apply steps ``run.applied..stop-1`` as far as anyone outside the running requests can
        see: block allocations and prefix-cache commits, in the order single steps make them (step
        by step: all allocations in batch order at scheduling, then all commits at update), and
        the engine's counters. The requests' own progress fields are settled by :meth:`settle`
        when the run closes (only the engine reads them, and it cannot step while a run is open).
        """
        first = run.applied
        if stop <= first:
            return
        if stop > run.events_upto:
            self._more_events(run, run.num_steps)
        b = run.batch
        events, k = run.events, run.cursor
        bound = 2 * stop * b  # events of steps before ``stop`` are below it
        if k < len(events) and events[k] < bound:
            end = bisect_left(events, bound, k)
            todo = events[k:end]
            run.cursor = end
            # A few events cost less one at a time than as numpy vectors; both give the same state.
            if len(todo) < _BULK_MIN_EVENTS or not self._apply_in_bulk(run, first, todo):
                self._apply_in_order(run, todo)
        n = stop - first
        self._queues.advance_decodes(b * n)  # the requests' progress is settled at close
        stats = self._stats
        stats.num_generated_tokens += b * n
        stats.num_steps += n
        run.applied = stop

    def _more_events(self, run: DecodeRun, upto: int) -> None:
        """Add the block events of steps ``run.events_upto..upto-1`` to ``run.events``, in order.

        ``((step * 2 + 0) * batch + batch index)``: a block taken at scheduling; ``(step * 2 + 1) ...``:
        one filled at update. Sorted, that is the order single steps make them in (ints: no tuple
        to build per event, and a cheaper sort); every event of a later stretch sorts after these.
        """
        bs = self._kv.block_size
        caching = self._kv.caching
        b = run.batch
        s0 = run.events_upto
        new: list[int] = []
        # (While loops, not comprehensions over ``range(a, upto, bs)``: compiled, a range with a
        # step is a Python object iterated through the generic protocol.)
        for i, (a, nc0) in enumerate(zip(run.first_alloc, run.nc0, strict=True)):
            if a < s0:
                a += (s0 - a + bs - 1) // bs * bs
            while a < upto:
                new.append(2 * a * b + i)
                a += bs
            if caching:
                c = (-nc0 - 1) % bs  # steps after which num_computed is a multiple of the block size
                if c < s0:
                    c += (s0 - c + bs - 1) // bs * bs
                while c < upto:
                    new.append((2 * c + 1) * b + i)
                    c += bs
        new.sort()
        run.events += new
        run.events_upto = upto

    def _apply_in_order(self, run: DecodeRun, events: list[int]) -> None:
        """Every allocation and commit one at a time, in the order single steps make them."""
        kv = self._kv
        pool = kv.pool  # (methods called on the object, not bound to a name: compiled, those are direct calls)
        reqs, nc0 = run.requests, run.nc0
        b = run.batch
        for e in events:
            step_kind = e // b  # (not divmod: compiled, it boxes both ints into a tuple)
            i = e - step_kind * b
            r = reqs[i]
            if step_kind & 1 == 0:
                r.blocks.append(pool.allocate_one())
            else:
                r.num_computed = nc0[i] + (step_kind >> 1) + 1
                kv.commit_full_blocks(r)

    def _apply_in_bulk(self, run: DecodeRun, first: int, events: list[int]) -> bool:
        """The same changes as :meth:`_apply_in_order`, with one pool allocation and one registration.

        Allocations only read and evict free blocks; commits only key blocks the batch holds. The two
        interact only where a commit's key is cached already (on a free block an allocation may
        evict first): when no commit key is, they commute, and each kind keeps its own order (the
        blocks come off the free queue in allocation order; of two commits of one key the earlier
        keeps it). False (nothing changed) when the bulk path does not apply.
        """
        kv, pool = self._kv, self._kv.pool
        bs = kv.block_size
        reqs, nc0 = run.requests, run.nc0
        b = run.batch
        allocs: list[tuple[int, int]] = []  # (step, batch index): each kind in its own order
        commits: list[tuple[int, int]] = []
        for e in events:
            step_kind = e // b  # (not divmod: compiled, it boxes both ints into a tuple)
            i = e - step_kind * b
            (commits if step_kind & 1 else allocs).append((step_kind >> 1, i))
        if commits:
            for i in {i for _, i in commits}:
                if reqs[i].num_keyed_blocks != (nc0[i] + first) // bs:
                    return False  # a lagging commit would register several blocks at once
            refs = [kv.block_ref(reqs[i], (nc0[i] + j + 1) // bs - 1) for j, i in commits]
            slots = pool.slots
            if any(slots.block_of(base, off) is not None for base, off, _ in refs):
                return False
        if allocs:
            blocks = pool.allocate(len(allocs))
            for (_, i), block in zip(allocs, blocks, strict=True):
                reqs[i].blocks.append(block)
        if commits:
            for (j, i), (base, off, count) in zip(commits, refs, strict=True):
                r = reqs[i]
                full = (nc0[i] + j + 1) // bs
                r.num_computed = nc0[i] + j + 1
                r.num_keyed_blocks = full
                pool.register_one(r.blocks[full - 1], base, off, count)  # of two commits of one key, the first keeps it
        return True

    @staticmethod
    def settle(run: DecodeRun) -> None:
        """Set the requests' progress to the end of the run's applied steps (as single steps would)."""
        n = run.applied
        if n == 0:
            return
        starts = run.starts
        end = starts[n]
        # Token gaps: step j's token follows step j-1's by starts[j+1] - starts[j] (float difference).
        shared_gap = 0.0  # the largest of them after the first step's (none: 0)
        if n >= 2:
            shared_gap = starts[2] - starts[1]
            for j in range(2, n):
                gap = starts[j + 1] - starts[j]
                if gap > shared_gap:
                    shared_gap = gap
        first_end = starts[1]
        for r, nc0 in zip(run.requests, run.nc0, strict=True):
            nc = nc0 + n
            r.num_computed = nc
            r.num_tokens = nc + 1
            gap = first_end - r.last_token_s
            if gap < shared_gap:
                gap = shared_gap
            if gap > r.max_itl_s:
                r.max_itl_s = gap
            r.output_tokens += n
            r.last_token_s = end


def _allocations(first_alloc: list[int], k: int, bs: int) -> int:
    """Blocks the batch takes in its first ``k`` steps (request i at steps first_alloc[i] + m * bs)."""
    return sum((k - a - 1) // bs + 1 for a in first_alloc if a < k)
