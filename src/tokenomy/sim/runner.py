"""Run one simulation: sessions in, records and a metrics summary out.

Sessions arrive open-loop (each at its ``start_s``); within a session the next turn arrives
only after the previous answer finished plus the turn's ``think_time_s`` (closed loop).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from tokenomy.core import SLO, Request, RequestRecord, Role, Session, TokenUsage
from tokenomy.engine import EventTrace
from tokenomy.metrics import Summary, summarize
from tokenomy.metrics.window import busy_window_s, span_s
from tokenomy.perf import PerfModel, get_gpu, get_model
from tokenomy.perf.engine_calibration import CalibratedPerfModel, load_calibration
from tokenomy.policy.trace import TraceSink
from tokenomy.sim import deployments as _deployments  # noqa: F401  (registers the deployments)
from tokenomy.sim.admission_gate import AdmissionGate
from tokenomy.sim.base import Deployment, SimContext, get_deployment
from tokenomy.sim.config import SimConfig
from tokenomy.sim.link import TransferStats
from tokenomy.sim.loop import EventLoop

ProgressFn = Callable[[float], None]

REJECT_EXCEEDS_KV = "prompt + output tokens exceed every instance's KV capacity"


@dataclass
class SimResult:
    """Everything a simulation produced."""

    config: SimConfig
    records: list[RequestRecord]
    summary: Summary
    sim_end_s: float
    wall_s: float
    events: int
    num_gpus: int
    instance_busy_s: dict[str, float] = field(default_factory=dict)
    transfers: TransferStats = field(default_factory=TransferStats)
    """The KV network's traffic: waits, bytes by link and by what was carried, timeouts."""

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records)


class _Driver:
    """Turns sessions into arrivals and finished turns into the next turn's arrival."""

    def __init__(self, loop: EventLoop, sessions: Sequence[Session], frontend_s: float = 0.0) -> None:
        self.loop = loop
        self.sessions = sessions
        self.frontend_s = frontend_s  # a calibration's latency outside the engine (perf.engine_calibration)
        self.records: list[RequestRecord] = []
        self.deployment: Deployment | AdmissionGate | None = None
        self.rejected: dict[str, int] = {}
        self._session_of: dict[str, Session] = {}
        # Session starts, in the order they run (indices into ``sessions``). Only the next one is on
        # the loop's heap (a trace's 12,031 starts there made every event cost a dozen comparisons
        # more), in the place it would have had scheduled with the rest: session i's is
        # ``_first_seq + i``, taken for all of them at once.
        self._order: list[int] = []
        self._first_seq = 0
        self._next_start = 0
        self.last_incomplete_s = 0.0
        self._max_request_tokens = 0  # the deployment's, read at start (its instances are made with it)

    def start(self) -> None:
        assert self.deployment is not None
        self._max_request_tokens = self.deployment.max_request_tokens
        for s in self.sessions:
            if s.session_id in self._session_of:
                raise ValueError(f"duplicate session id {s.session_id!r}")
            self._session_of[s.session_id] = s
        self._first_seq = self.loop.reserve_seqs(len(self.sessions))
        sessions = self.sessions
        # The heap's order: time, then place (a stable sort of the indices by time: ties keep theirs).
        self._order = sorted(range(len(sessions)), key=lambda i: sessions[i].start_s)
        self._feed()

    def _feed(self) -> None:
        """Put the next session's start on the loop."""
        k = self._next_start
        if k < len(self._order):
            i = self._order[k]
            self._next_start = k + 1
            session = self.sessions[i]
            self.loop.at_in(session.start_s, self._first_seq + i, self._start, session)

    def _start(self, session: Session) -> None:
        self._feed()
        self._arrive(session, 0)

    def _arrive(self, session: Session, index: int) -> None:
        assert self.deployment is not None
        request = Request.from_turn(session, index, self.loop.now)
        if request.prompt_tokens + request.max_output_tokens > self._max_request_tokens:
            # No instance could ever hold its KV: rejected at the door, the session ends here.
            # Not a record: a refused request adds no tokens or time, only an SLO miss.
            reason = REJECT_EXCEEDS_KV
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            return
        if self.frontend_s > 0:  # the engine sees it that much later; its TTFT counts from arrival
            self.loop.at(self.loop.now + self.frontend_s, self._submit, request)
        else:
            self._submit(request)

    def _submit(self, request: Request) -> None:
        assert self.deployment is not None
        self.deployment.submit(request, self.loop.now)  # a gate that refuses it ends the session

    def done(self, request: Request, record: RequestRecord) -> None:
        self.records.append(record)
        if record.finish_s is None:  # incomplete (a KV transfer cut by its timeout): the session ends
            self.last_incomplete_s = max(self.last_incomplete_s, self.loop.now)
        session = self._session_of[request.session_id]
        nxt = request.turn + 1
        if nxt < len(session.turns) and record.finish_s is not None:
            self.loop.at(record.finish_s + session.turns[nxt].think_time_s, self._arrive, session, nxt)


def calibrated(config: SimConfig) -> tuple[SimConfig, PerfModel]:
    """``config`` and its performance model: the catalog's, or with ``config.calibration`` the
    profiled engine's fitted steps, with the engine limits the calibration recorded in place of
    ``config``'s (block size, token budget, batch limit; KV blocks through the model)."""
    if config.calibration is None:
        return config, PerfModel.from_names(config.model, config.gpu, config.tp)
    cal = load_calibration(config.calibration)
    e = cal.engine
    config = replace(config, block_size_tokens=e.block_size_tokens or config.block_size_tokens,
                     max_num_batched_tokens=e.max_num_batched_tokens or config.max_num_batched_tokens,
                     max_num_seqs=e.max_num_seqs or config.max_num_seqs)
    return config, cal.perf_model(get_model(config.model), get_gpu(config.gpu), config.tp)


def simulate(
    sessions: Sequence[Session],
    config: SimConfig,
    slo: SLO,
    *,
    perf: PerfModel | None = None,
    progress: ProgressFn | None = None,
    trace: EventTrace | None = None,
    decision_trace: TraceSink | None = None,
) -> SimResult:
    """Simulate ``sessions`` on the deployment ``config`` describes and summarise against ``slo``.

    Deterministic: the same sessions and config give the same records. ``trace`` receives every
    engine's events (:mod:`tokenomy.engine.trace`), stamped with simulated time; ``decision_trace``
    receives every policy decision the deployment applies, as flat JSON-ready events.
    """
    with _collector_paused():
        return _simulate(sessions, config, slo, perf=perf, progress=progress, trace=trace,
                         decision_trace=decision_trace)


def _simulate(
    sessions: Sequence[Session],
    config: SimConfig,
    slo: SLO,
    *,
    perf: PerfModel | None,
    progress: ProgressFn | None,
    trace: EventTrace | None,
    decision_trace: TraceSink | None,
) -> SimResult:
    wall0 = time.perf_counter()
    if perf is None:
        config, perf = calibrated(config)
    role_perf = {}
    if config.has_role_shapes:
        role_perf = {role: PerfModel.from_names(config.model, *config.role_shape(role.value))
                     for role in (Role.PREFILL, Role.DECODE)}
    loop = EventLoop()
    driver = _Driver(loop, sessions, perf.calibration.frontend_s if isinstance(perf, CalibratedPerfModel) else 0.0)
    ctx = SimContext(loop=loop, perf=perf, config=config, done=driver.done, slo=slo, trace=trace,
                     decision_trace=decision_trace, role_perf=role_perf)
    deployment = get_deployment(config.deployment)(ctx)
    gate = None
    if config.admission is not None:
        gate = AdmissionGate(loop, deployment, config.admission, sessions, driver.done, decision_trace)
        ctx.done = gate.on_done
    driver.deployment = gate or deployment
    driver.start()
    horizon = config.horizon_s if config.horizon_s is not None else float("inf")
    loop.run(until_s=horizon, on_tick=progress)
    records = driver.records + [_unfinished(r) for r in (gate or deployment).unfinished()]
    # Requests of sessions whose turn never arrived before the horizon are not counted:
    # they were never offered to the system.
    sim_end = max((r.finish_s for r in records if r.finish_s is not None), default=driver.last_incomplete_s)
    sim_end = max(sim_end, driver.last_incomplete_s)
    if config.horizon_s is not None and loop.pending:
        sim_end = config.horizon_s
    # Rates and costs are over the busy window (metrics/window.py), not a span stretched by
    # think time; a run where nothing was admitted has a zero window and zero rates.
    window = busy_window_s(records, sim_end)
    summary = summarize(
        records,
        slo=slo,
        duration_s=window,
        num_gpus=deployment.num_gpus,
        usd_per_gpu_hour=_gpu_weighted(deployment, perf, "usd_per_gpu_hour") / deployment.num_gpus,
        total_flops=sum(i.flops for i in deployment.instances),
        peak_flops_per_s=_gpu_weighted(deployment, perf, "bf16_flops_per_s"),
        itl_values=ctx.itl.values(),
        itl_weights=ctx.itl.weights(),
        rejected=driver.rejected | dict(gate.rejected) if gate is not None else driver.rejected,
        span_s=span_s(records, sim_end),
        tenant_refusals=gate.refused if gate is not None else None,
        tenant_deferrals=gate.deferred if gate is not None else None,
        tenant_retries=gate.retried if gate is not None else None,
    )
    return SimResult(
        config=config,
        records=records,
        summary=summary,
        sim_end_s=sim_end,
        wall_s=time.perf_counter() - wall0,
        events=loop.events_run,
        num_gpus=deployment.num_gpus,
        instance_busy_s={i.instance_id: i.busy_s for i in deployment.instances},
        transfers=deployment.fabric.stats if deployment.fabric is not None else TransferStats(),
    )


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a simulation runs and is summarised, and
    restore it after.

    The loop's events and the summary make no reference cycles (their objects are freed by
    reference counting; the cycles of a simulation are its own long-lived graph, freed when the
    caller drops it), but the collector's passes over that graph cost 3-7% of a replay (sim_speed,
    paired runs), and those the summary's allocations set off right after the loop cost more (on
    the Mooncake replay, over everything the loop allocated: a generation-1 pass of 60 ms in a
    process's first replay; passes of generations 0 and 1, 64 and 46 ms, in its second), every
    one of them finding nothing to free. Re-enabled, the collector makes one young pass over what
    the run left (23 ms after a Mooncake replay, inside ``simulate``: it also frees the run's own
    graph, the engines and the loop, which is garbage once ``_simulate`` returns). It is kept: moving
    those objects to the oldest generation unscanned (``gc.freeze()`` then ``gc.unfreeze()``) would
    leave each run's graph to the next full pass, which a sweep running one simulation after another
    in one process would put off while their garbage piles up. The pause is process-wide: another
    thread of the process collects no cycles while a simulation runs.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _gpu_weighted(deployment: Deployment, perf: PerfModel, field_name: str) -> float:
    """Sum over the deployment's GPUs of a GPUSpec field (instances may run on different GPUs)."""
    total = 0.0
    for inst in deployment.instances:
        gpu = inst.engine.perf.gpu if isinstance(inst.engine.perf, PerfModel) else perf.gpu
        total += deployment.gpus_of(inst) * getattr(gpu, field_name)
    return total


def _unfinished(request: Request) -> RequestRecord:
    return RequestRecord(
        request_id=request.request_id,
        arrival_s=request.arrival_s,
        first_token_s=None,
        finish_s=None,
        prompt_tokens=request.prompt_tokens,
        output_tokens=0,
        session_id=request.session_id,
        turn=request.turn,
        tenant=request.tenant,
        tier=request.tier,
        usage=TokenUsage(),
        finished=False,
    )
