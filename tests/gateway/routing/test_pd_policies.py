"""The gateway's P/D routing without processes: the vLLM hand-off body, config errors, the gated
prefill queue (look-ahead release with its deferral cap), and the registry test: the gateway's
AMPD mode and the simulator build their decisions from the same ``AMPD_POLICIES`` entries."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tokenomy.core import SLO
from tokenomy.gateway.config import BackendConfig, HealthConfig, config_from_dict
from tokenomy.gateway.metering.prom import GatewayMetrics
from tokenomy.gateway.routing.ampd_counts import AmpdCounts
from tokenomy.gateway.routing.ampd_gates import DecodeGate, GatedPrefillQueue
from tokenomy.gateway.routing.ampd_live import AmpdLive, ampd_policy_config
from tokenomy.gateway.routing.backends import Backend, BackendPool
from tokenomy.gateway.routing.config import RoutingConfig
from tokenomy.gateway.routing.prefill import prefill_body
from tokenomy.perf import PerfModel
from tokenomy.policy.ampd import (
    AMPD_POLICIES,
    AdmissionTask,
    DispatchConfig,
    PrefillDispatch,
    PrefillTask,
    SlackAdmission,
)
from tokenomy.policy.ampd.reorder import LookaheadReorder, ReorderConfig
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant
from tokenomy.workload.registry import load_workload

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def test_prefill_request_is_vllms_remote_decode_handoff() -> None:
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 300, "max_completion_tokens": 300}
    out = prefill_body(body)
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert out["kv_transfer_params"]["do_remote_prefill"] is False
    assert (out["stream"], out["max_tokens"], out["max_completion_tokens"]) == (False, 1, 1)
    assert "stream_options" not in out
    assert body["max_tokens"] == 300 and body["stream"] is True  # the decode request is untouched
    assert "tokenomy_history_tokens" not in out["kv_transfer_params"]  # vLLM's keys only, by default
    assert prefill_body(body, history_tokens=4096)["kv_transfer_params"]["tokenomy_history_tokens"] == 4096


@pytest.mark.parametrize(("routing", "roles", "message"), [
    ({"mode": "ampd"}, ["mixed"], "routing.mode ampd: needs backends with role: decode"),
    ({"mode": "disagg"}, ["decode"], "routing.mode disagg: needs backends with role: prefill"),
    ({"mode": "pd"}, ["decode"], "routing.mode: Input should be"),
    ({"mode": "ampd", "slo": {"tpot_s": 0}}, ["decode"], "routing.slo.tpot_s"),
])
def test_bad_routing_sections_are_one_line_errors(routing: dict[str, Any], roles: list[str], message: str) -> None:
    backends = [{"id": f"b{i}", "url": f"http://127.0.0.1:{9000 + i}", "role": r} for i, r in enumerate(roles)]
    with pytest.raises(ValueError, match=message) as err:
        config_from_dict({"backends": backends, "routing": routing}, source="gw.yaml")
    assert str(err.value).startswith("gw.yaml: ") and "\n" not in str(err.value)


def _task(rid: str, deadline_in_s: float, tokens: int) -> PrefillTask:
    now = time.monotonic()  # the queue decides on the monotonic clock
    return PrefillTask(rid, now, now + deadline_in_s, tokens, 0)


def test_gated_queue_releases_within_budget_and_reorders_up_to_the_deferral_cap() -> None:
    async def run() -> list[str]:
        dispatch = PrefillDispatch(DispatchConfig(engine_budget_tokens=900),
                                   LookaheadReorder(ReorderConfig(max_deferrals=1), PERF))
        q = GatedPrefillQueue(dispatch, "prefill-0")
        order: list[str] = []

        async def one(task: PrefillTask) -> None:
            await q.acquire(task)
            order.append(task.request_id)

        q.released["busy"] = 900  # a prefill the engine is computing: nothing waits behind it
        first = asyncio.ensure_future(one(_task("a", 100.0, 900)))
        await asyncio.sleep(0)
        assert order == ["a"] and q.engine_waiting_tokens == 900  # "a" waits: a step's worth
        # a long task with a late deadline queues before two urgent short ones
        waiting = [asyncio.ensure_future(one(t)) for t in
                   (_task("long", 1000.0, 6000), _task("u1", 0.3, 50), _task("u2", 0.3, 50))]
        await asyncio.sleep(0)
        assert order == ["a"] and [t.request_id for t in q.tasks] == ["long", "u1", "u2"]
        q.done("busy")  # "a" starts computing; u1 overtakes the long task (deferred once: the cap),
        await asyncio.sleep(0)  # which then goes before u2 and fills the engine's queue
        assert order == ["a", "u1", "long"] and [t.request_id for t in q.tasks] == ["u2"]
        for rid in ("a", "u1"):
            q.done(rid)
        await asyncio.gather(first, *waiting)
        return order

    assert asyncio.run(run()) == ["a", "u1", "long", "u2"]


def test_gateway_ampd_and_simulator_build_decisions_from_the_same_registry_entries(
    spied_registry: dict[str, list[Any]]
) -> None:
    sessions = load_workload("gaia", rate_per_s=1.0, duration_s=4.0, seed=3)
    simulate(sessions, make_variant("ampd", SimConfig(instances=4, prefill=2, decode=2, gpu_memory_utilization=0.3)),
             SLO(), perf=PERF)
    sim_built = {name: objs[0] for name, objs in spied_registry.items()}

    async def build() -> AmpdLive:
        cfg = config_from_dict({"backends": [{"id": "d", "url": "http://127.0.0.1:1", "role": "decode"}],
                                "routing": {"mode": "ampd"}})
        async with httpx.AsyncClient() as http:
            return AmpdLive.build(cfg.routing, BackendPool(cfg.backends, HealthConfig(), http), http)

    live = asyncio.run(build())
    assert set(live.policies.built_from) == set(AMPD_POLICIES.names())
    assert all(len(objs) == 2 for objs in spied_registry.values()), spied_registry  # one by each path
    for name, objs in spied_registry.items():
        assert type(objs[1]) is type(sim_built[name]), name  # the same policy classes
    assert live.policies.placement is spied_registry["placement"][1]  # the live path uses what it built
    # the live defaults are the simulator's (docs/ampd.md), except the decode node's chunk budget:
    # the simulator's decode engines chunk at 512 tokens, vLLM's (and the emulator's) at 2048+,
    # and only the simulator's engine caps one request's chunk (size_local_chunks, and the TPOT
    # bank's chunks re-sized every step)
    default = ampd_policy_config(RoutingConfig())
    assert default.placement is not None
    assert replace(default.placement, local_budget_tokens=512, size_local_chunks=True,
                   tpot_bank=True) == sim_built["placement"].config
    assert default.binding == sim_built["binding"].config
    assert default.retention == sim_built["retention"].config
    assert default.reorder == sim_built["dispatch"].reorder.config


def test_gateway_releases_a_sessions_older_pin_and_frees_pins_under_kv_pressure() -> None:
    posts: list[tuple[str, float]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        posts.append((body["request_id"], body["ttl_s"]))
        return httpx.Response(200, json={"accepted": True})

    async def run() -> None:
        cfg = config_from_dict({"backends": [{"id": "d", "url": "http://127.0.0.1:1", "role": "decode",
                                              "total_blocks": 1000}], "routing": {"mode": "ampd"}})
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as http:
            live = AmpdLive.build(cfg.routing, BackendPool(cfg.backends, HealthConfig(), http), http)
            d = live.pool.by_id["d"]
            d.kv_usage = 0.2

            async def turn(sid: str, rid: str) -> None:
                req = SimpleNamespace(session_id=sid, request_id=rid, prompt_tokens_estimate=4000, max_tokens=100)
                await live._retention_hint(req, d, time.monotonic(), 4000)  # type: ignore[arg-type]
                live.turn_ended(req)  # type: ignore[arg-type]
                await asyncio.gather(*live._tasks)

            await turn("s1", "s1:0")
            assert [ttl > 0 for _, ttl in posts] == [True]  # a short tool, no pressure: keep
            await turn("s1", "s1:1")
            assert posts[1][0] == "s1:1" and posts[2] == ("s1:0", 0.0)  # the older pin is released
            await turn("s2", "s2:0")
            assert len(posts) == 4  # no pressure: nothing released
            d.kv_usage = 0.9  # above high_usage: pins are freed down to the relief target
            await turn("s3", "s3:0")
            released = [rid for rid, ttl in posts[4:] if ttl == 0]  # (s3's own turn is not kept: pressure)
            # 0.9 -> 0.7 of 16,000 tokens frees 3,200: one 4,100-token pin, the one resuming last
            assert released == ["s2:0"]

    asyncio.run(run())


def test_gateway_calibrates_its_prompt_estimate_from_what_backends_count() -> None:
    async def build() -> AmpdLive:
        cfg = config_from_dict({"backends": [{"id": "d", "url": "http://127.0.0.1:1", "role": "decode"}],
                                "routing": {"mode": "ampd"}})
        async with httpx.AsyncClient() as http:
            return AmpdLive.build(cfg.routing, BackendPool(cfg.backends, HealthConfig(), http), http)

    live = asyncio.run(build())
    req = SimpleNamespace(session_id="", request_id="r", prompt_tokens_estimate=4000, max_tokens=10)
    assert live.prompt_tokens(req) == 4000  # type: ignore[arg-type]  # nothing learnt yet
    for _ in range(100):  # the engines count 3 tokens where the parser guessed 4
        live.turn_ended(req, prompt_tokens=3000)  # type: ignore[arg-type]
    assert abs(live.prompt_tokens(req) - 3000) <= 1  # type: ignore[arg-type]


def _admission_task(rid: str, arrival_s: float, prefill_tokens: int, blocks: int) -> AdmissionTask:
    return AdmissionTask(rid, arrival_s, prefill_tokens, 0, blocks)


def test_decode_gate_passes_turns_while_memory_lasts_and_releases_least_slack_first_when_full() -> None:
    """The live counterpart of the simulator's decode admission queue: a memory-full decode
    backend gets the held turn of least TTFT slack next, hopeless turns last."""

    async def run() -> None:
        backend = Backend(BackendConfig(id="d0", url="http://127.0.0.1:1", role="decode", total_blocks=1000))
        gate = DecodeGate(SlackAdmission(PERF), backend, SLO(ttft_s=2.0, tpot_s=0.1), stale_s=60.0)
        backend.on_progress = gate.progress
        order: list[str] = []

        async def one(task: AdmissionTask) -> None:
            await gate.acquire(task)
            order.append(task.request_id)

        now = time.monotonic()
        # memory to spare: turns pass at once, however many are still prefilling
        await asyncio.gather(one(_admission_task("r0", now, 100, 100)), one(_admission_task("r1", now, 100, 100)))
        assert order == ["r0", "r1"] and gate.held == 0
        backend.kv_usage = 0.95  # 50 free blocks, and r0, r1 still have no first token
        waiting = [asyncio.ensure_future(one(t)) for t in (
            _admission_task("hopeless", now - 5.0, 0, 10),  # already past its 2 s TTFT
            _admission_task("relaxed", now, 0, 10),  # 2 s of slack
            _admission_task("urgent", now - 1.5, 0, 10),  # 0.5 s of slack
        )]
        await asyncio.sleep(0)
        assert order == ["r0", "r1"] and gate.held == 3
        backend.first_token("r0")  # r1 still waits in the engine: only memory for one more
        await asyncio.sleep(0)
        assert order[2:] == []  # 50 free blocks < r1's 100 + 10
        backend.kv_usage = 0.5
        backend.first_token("r1")  # nothing waits in the engine: the least slack goes first
        await asyncio.sleep(0)
        assert order[2:] == ["urgent", "relaxed", "hopeless"]
        await asyncio.gather(*waiting)
        assert gate.reordered >= 1

    asyncio.run(run())


def test_decode_gate_forgets_a_released_turn_that_never_reached_the_backend() -> None:
    async def run() -> None:
        backend = Backend(BackendConfig(id="d0", url="http://127.0.0.1:1", role="decode", total_blocks=100))
        gate = DecodeGate(SlackAdmission(PERF), backend, SLO(), stale_s=0.0)
        backend.kv_usage = 1.0
        gate.released["gone"] = (10, time.monotonic() - 1.0)  # its client left before it was sent
        await asyncio.wait_for(gate.acquire(_admission_task("next", time.monotonic(), 0, 10)), 1.0)
        assert list(gate.released) == ["next"]

    asyncio.run(run())


def test_ampd_gates_are_on_the_gateways_metrics() -> None:
    gate = SimpleNamespace(tasks=[object(), object()], held=3, reordered=1)
    queue = SimpleNamespace(tasks=[], held=5)
    metrics = GatewayMetrics()
    counts = AmpdCounts()
    for event in ({"kind": "placement", "t_s": 1.0, "local": True}, {"kind": "placement", "t_s": 2.0, "local": False},
                  {"kind": "dispatch", "t_s": 3.0, "overtaken": 2, "prefill_instance": "prefill-0"}):
        counts.add(event)
    metrics.watch_ampd(SimpleNamespace(queues={"prefill-0": queue}, gates={"decode-1": gate}, counts=counts))
    text = metrics.render().decode()
    assert 'tokenomy_gateway_ampd_placements_total{placement="local"} 1.0' in text
    assert 'tokenomy_gateway_ampd_placements_total{placement="remote"} 1.0' in text
    assert 'tokenomy_gateway_ampd_prefill_reordered_total{backend="prefill-0"} 1.0' in text
    assert 'tokenomy_gateway_ampd_deferrals_total{backend="prefill-0"} 2.0' in text
    assert 'tokenomy_gateway_ampd_waiting{backend="decode-1",gate="decode"} 2.0' in text
    assert 'tokenomy_gateway_ampd_held_total{backend="decode-1",gate="decode"} 3.0' in text
    assert 'tokenomy_gateway_ampd_held_total{backend="prefill-0",gate="prefill"} 5.0' in text
    assert 'tokenomy_gateway_ampd_decode_reordered_total{backend="decode-1"} 1.0' in text
