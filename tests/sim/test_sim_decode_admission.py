"""Admission on a memory-full decode instance: slack order lets a turn that can still meet its
TTFT go before older turns that cannot (``DecodeAdmissionQueue`` applying ``SlackAdmission``)."""

from __future__ import annotations

from tokenomy.core import SLO, Request, Role
from tokenomy.engine import Engine, EngineConfig, StepResult
from tokenomy.perf import PerfModel
from tokenomy.policy.ampd import AdmissionTask, SlackAdmission
from tokenomy.sim.deployments.decode_queue import DecodeAdmissionQueue
from tokenomy.sim.instance import SimInstance
from tokenomy.sim.loop import EventLoop

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)
BLOCKS = 120  # of 16 tokens


def request(rid: str, key: int, arrival_s: float, prompt: int, output: int) -> Request:
    return Request(rid, arrival_s, prompt, output, session_id=rid, content=((key, prompt),))


def ttfts(slack_order: bool) -> dict[str, float]:
    """A decode instance full with one long request; at 0.05 s three turns queue for it: two that
    arrived 5 s ago (their TTFT is already lost) and a fresh one. Returns TTFT by request id."""
    loop = EventLoop()
    engine = Engine("decode-0", EngineConfig(num_gpu_blocks=BLOCKS, max_num_batched_tokens=2048), PERF, role=Role.DECODE)
    first: dict[str, float] = {}
    queue: DecodeAdmissionQueue | None = None

    def on_result(inst: SimInstance, result: StepResult) -> None:
        for fin in result.finished:
            assert fin.first_token_s is not None
            first[fin.request_id] = fin.first_token_s
        if result.finished and queue is not None:
            queue.pump(loop.now)

    inst = SimInstance(engine, loop, on_result)
    if slack_order:
        queue = DecodeAdmissionQueue(inst, SlackAdmission(PERF), SLO_)
    # Blocks are taken for the prompt at admission and as the answer grows.
    inst.submit(request("blocker", 1, 0.0, 1800, 100), 0.0)  # 113 of the 120 blocks for ~0.7 s
    turns = [
        request("late-small", 2, -5.0, 200, 16),  # 13 blocks
        request("late-long", 3, -5.0, 1300, 400),  # 82 blocks, then decodes for seconds
        request("fresh", 4, 0.05, 900, 100),  # 57 blocks: fits beside one of the two only
    ]
    arrivals = {r.request_id: r.arrival_s for r in turns}

    def arrive() -> None:
        for r in turns:
            if queue is None:
                inst.submit(r, loop.now)
            else:
                task = AdmissionTask(r.request_id, r.arrival_s, r.prompt_tokens, 0,
                                     -(-(r.prompt_tokens + r.max_output_tokens) // 16))
                queue.push(task, lambda at, r=r: inst.submit(r, at), loop.now)  # type: ignore[misc]

    loop.at(0.05, arrive)
    loop.run()
    return {rid: first[rid] - arrivals[rid] for rid in arrivals}


def test_slack_order_lets_the_fresh_turn_meet_its_ttft_where_fifo_misses_it() -> None:
    fifo, slack = ttfts(False), ttfts(True)
    assert fifo["fresh"] > SLO_.ttft_s  # behind the long late turn, admitted first in FIFO order
    assert slack["fresh"] < SLO_.ttft_s
    # the late turns were lost either way; nothing is dropped
    assert min(fifo["late-long"], slack["late-long"]) > SLO_.ttft_s
