"""An engine instance driven by the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from tokenomy.core import Request
from tokenomy.engine import Engine, FinishedRequest, StepResult
from tokenomy.engine.decode_run import DecodeRun, sum_in_order
from tokenomy.sim.loop import EventLoop

ResultHandler = Callable[["SimInstance", StepResult], None]

DEFAULT_MAX_RUN_STEPS = 4096

ITL_CHUNK: Final = 1 << 16
"""Pooled ITL samples per vector (:class:`PooledItl`): large enough that converting a chunk costs
no more per sample than one conversion of them all, small next to a long replay's samples."""


class PooledItl:
    """A simulation's pooled inter-token-latency samples: each decode-carrying step's duration,
    weighted by the decode tokens it delayed (its batch), in event order (what ``summarize`` takes as
    ``itl_values`` and ``itl_weights``).

    The weights are kept run-length encoded: a decode run's steps all carry its batch, so a run
    adds one weight however many steps it has, and :meth:`weights` expands them into one float
    vector with a single ``numpy.repeat`` (a Mooncake replay pools 1.9M samples: converting a list
    of that many ints took about 50 ms of its summary).

    The values go to a list and, once it holds :data:`ITL_CHUNK` of them, into a float vector: a list of
    1.9M floats held to the end is both 45 MB of float objects and, for the cyclic collector's
    first pass after the run (``runner._collector_paused``), 1.9M pointers to follow to floats
    scattered over the heap (100-120 ms of a Mooncake replay's 2.3 s, measured; a vector is no
    container to it)."""

    __slots__ = ("_values", "_chunks", "_flushed", "_weights", "_counts")

    def __init__(self) -> None:
        self._values: list[float] = []  # the newest samples, fewer than ITL_CHUNK
        self._chunks: list[npt.NDArray[np.float64]] = []  # the older ones, in vectors
        self._flushed = 0  # samples in those vectors
        self._weights: list[int] = []  # distinct consecutive weights ...
        self._counts: list[int] = []  # ... and how many samples in a row carry each

    def __len__(self) -> int:
        return self._flushed + len(self._values)

    def add(self, value: float, weight: int) -> None:
        """One sample."""
        values = self._values
        values.append(value)
        self._repeat(weight, 1)
        if len(values) >= ITL_CHUNK:
            self._flush()

    def add_run(self, values: list[float], first: int, stop: int, weight: int) -> None:
        """``values[first:stop]``, each weighted ``weight``."""
        if stop > first:
            mine = self._values
            mine.extend(values[first:stop])
            self._repeat(weight, stop - first)
            if len(mine) >= ITL_CHUNK:
                self._flush()

    def _flush(self) -> None:
        """Move the list's samples into a vector (``fromiter``: half ``numpy.array``'s cost, which
        first inspects every element for its type and shape)."""
        values = self._values
        self._chunks.append(np.fromiter(values, dtype=np.float64, count=len(values)))
        self._flushed += len(values)
        values.clear()

    def _repeat(self, weight: int, n: int) -> None:
        weights = self._weights
        if weights and weights[-1] == weight:
            self._counts[-1] += n
        else:
            weights.append(weight)
            self._counts.append(n)

    def values(self) -> npt.NDArray[np.float64]:
        """Every sample's value, as one float vector in sample order."""
        tail = np.fromiter(self._values, dtype=np.float64, count=len(self._values))
        return np.concatenate([*self._chunks, tail]) if self._chunks else tail

    def weights(self) -> npt.NDArray[np.float64]:
        """Each sample's weight, as one float vector in sample order."""
        return np.repeat(np.array(self._weights, dtype=np.float64), np.array(self._counts, dtype=np.int64))


class SimInstance:
    """Steps one :class:`Engine` back to back while it has work.

    The engine schedules and applies a step at its start time and reports what happened at
    its end; this wrapper delivers the result at ``end_s`` and immediately starts the next
    step, like a real engine's busy loop. Requests added while a step is in flight wait for
    the next one, as in vLLM.

    Decode fast-forward (``fast_forward=True``, the default): when the engine only decodes, it
    plans a whole run of decode steps (:meth:`Engine.plan_decode_run`) and this instance
    schedules one private event at the run's end instead of one event per step. (The run is priced
    lazily: the event first falls at the end of its priced steps, where the run is priced further
    and the event moves on, keeping its place among events at the same time, until the run's
    end.) The run is applied lazily, and exactly: the loop syncs this instance (applies the run's
    steps that started by then) before every event that may read or change any engine, and a
    request submitted mid-run cuts the run after the step in progress, from which stepping resumes
    as usual. The run's step results (never a finish) are delivered together at its end, in order,
    to ``on_result``, one :class:`StepResult` per step, as single steps would have produced them.
    ``busy_s``, ``flops`` and ``steps`` count each step when it is applied, as single steps do.

    Pooled ITL (``pooled_itl``, a :class:`PooledItl`, what a deployment passes): the instance adds
    each decode-carrying step's duration and decode batch size to it itself, single steps
    and runs alike (a run's samples at its end, in one call), where the handler would have, and hands
    ``on_result`` only the steps that finished requests, or every step while :attr:`every_step` is
    set (a deployment that watches an instance step by step sets it for as long as it watches: a
    run's steps still finish nothing and go to nobody). Without it every step goes to ``on_result``.
    """

    __slots__ = (
        "engine", "_loop", "_on_result", "_busy", "busy_s", "flops", "steps",
        "fast_forward", "max_run_steps", "_run", "_run_open", "_delivered", "_version", "_end_seq",
        "sync_on_finish", "every_step", "_pooled_itl",
    )

    def __init__(
        self,
        engine: Engine,
        loop: EventLoop,
        on_result: ResultHandler,
        *,
        fast_forward: bool = True,
        max_run_steps: int = DEFAULT_MAX_RUN_STEPS,
        pooled_itl: PooledItl | None = None,
    ) -> None:
        if max_run_steps < 2:
            raise ValueError(f"max_run_steps must be >= 2, got {max_run_steps}")
        self.engine = engine
        self._loop = loop
        self._on_result = on_result
        self._busy = False
        self.busy_s = 0.0
        self.flops = 0.0
        self.steps = 0
        self.fast_forward = fast_forward
        self.max_run_steps = max_run_steps
        self._run: DecodeRun | None = None  # the run whose results are still to be delivered
        self._run_open = False  # the engine's run is open: more of its steps may be applied
        self._delivered = 0  # results of ``_run`` already handed to ``on_result``
        self._version = 0  # bumps invalidate a pending run-end event
        self._end_seq = 0  # the pending run-end event's place among events at the same time
        # Sync every instance before handing a step that finished requests to ``on_result`` (the
        # deployment's handlers may read other instances); a deployment whose handlers read none
        # turns it off.
        self.sync_on_finish = True
        # Pooled ITL samples kept here (None: the handlers keep them) and whether every step, or
        # only a step that finished requests, goes to ``on_result`` (class docstring).
        self._pooled_itl = pooled_itl
        self.every_step = pooled_itl is None

    @property
    def instance_id(self) -> str:
        return self.engine.instance_id

    def submit(self, request: Request, now: float, **kwargs: object) -> None:
        """Queue a request on the engine (keyword arguments as :meth:`Engine.add_request`)."""
        if self._run_open:
            self._cut(now)
        self.engine.add_request(request, now, **kwargs)  # type: ignore[arg-type]
        self.kick(now)

    def abort(self, request_id: str, now: float) -> FinishedRequest | None:
        """Stop ``request_id`` here now (it moves elsewhere), freeing its KV; None if it is not
        here (it finished, possibly in a step whose result is still to be delivered)."""
        if self._run_open:
            self._cut(now)
        return self.engine.abort(request_id, now)

    def kick(self, now: float) -> None:
        """Start stepping if idle (after work was added from outside)."""
        if not self._busy:
            self._busy = True
            self._loop.at_private(now, self._step)

    def sync(self, now: float) -> None:
        """Apply the open decode run's steps that start at or before ``now`` (the loop calls this)."""
        run = self._run
        if self._run_open and run is not None and now >= run.next_start_s:
            first = run.applied
            self._account(run, first, self.engine.advance_decode_run(now))

    def settle(self, until_s: float) -> None:
        """The loop stopped at a horizon: apply the steps started by ``until_s`` and deliver the
        results of those that ended by then, as single steps would have been."""
        self.sync(until_s)
        run = self._run
        if run is not None:
            stop = run.applied
            while stop > self._delivered and run.starts[stop] > until_s:
                stop -= 1
            self._deliver(run, stop)

    def _deliver(self, run: DecodeRun, stop: int) -> None:
        first = self._delivered
        if stop <= first:
            return
        pooled = self._pooled_itl
        if pooled is not None:
            pooled.add_run(run.durations_s, first, stop, run.batch)
        else:
            on_result = self._on_result
            for result in run.results(first, stop):
                on_result(self, result)
        self._delivered = stop

    def _account(self, run: DecodeRun, first: int, stop: int) -> None:
        if stop > first:
            self.busy_s = sum_in_order(run.durations_s, first, stop, self.busy_s)
            self.flops = sum_in_order(run.flops, first, stop, self.flops)
            self.steps += stop - first

    def _close(self, now: float) -> DecodeRun:
        run = self._run
        assert run is not None and self._run_open
        first = run.applied
        self.engine.close_decode_run(now)
        self._account(run, first, run.applied)
        self._run_open = False
        return run

    def _cut(self, now: float) -> None:
        """End the open run after its step in progress at ``now`` (something changes the engine)."""
        run = self._close(now)
        self._version += 1
        self._loop.at_private(run.end_s, self._end_run, self._version)

    def _end_run(self, version: int) -> None:
        if version != self._version:
            return  # the run was cut; a later event delivers it
        if self._run_open:
            now = self._loop.now
            end_s = self.engine.price_decode_run(now).end_s
            if end_s > now:  # the run goes on past the steps priced when this event was set
                self._loop.at_private_in(end_s, self._end_seq, self._end_run, version)
                return
            self._close(now)
        run = self._run
        assert run is not None
        self._deliver(run, run.num_steps)
        self._run = None
        self._loop.discard_lazy(self)
        self._step()

    def _step(self) -> None:
        now = self._loop.now
        engine = self.engine
        if self.fast_forward:
            run = engine.plan_decode_run(now, self.max_run_steps)
            if run is not None:
                self._run = run
                self._run_open = True
                self._delivered = 0
                self._version += 1
                self._loop.add_lazy(self)
                self._end_seq = self._loop.reserve_seq()
                self._loop.at_private_in(run.end_s, self._end_seq, self._end_run, self._version)
                return
        result = engine.step(now)
        if result is None:
            self._busy = False
            return
        self.busy_s += result.duration_s
        self.flops += result.flops
        self.steps += 1
        self._loop.at_private(result.end_s, self._finish_step, result)

    def _finish_step(self, result: StepResult) -> None:
        self.engine.end_step()
        pooled = self._pooled_itl
        if pooled is not None:
            seqs = result.shape.decode_seqs
            if seqs:  # every decode token of this step waited one step duration (vLLM's ITL pools gaps)
                pooled.add(result.duration_s, seqs)
            if not result.finished and not self.every_step:
                self._step()
                return
        if result.finished and self.sync_on_finish:
            self._loop.sync(self._loop.now)  # the deployment's handlers read other instances
        self._on_result(self, result)
        self._step()
