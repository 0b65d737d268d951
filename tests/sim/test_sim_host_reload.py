"""The host tier as placement sees it (``KVKeeper.reload_estimate``): what a local turn would
reload over its decode instance's PCIe link, and when that would be done, queue included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenomy.core import SLO, Request
from tokenomy.perf import PerfModel
from tokenomy.policy.ampd import HostReload, RetentionConfig
from tokenomy.sim import SimConfig
from tokenomy.sim.base import SimContext
from tokenomy.sim.deployments.ampd import AMPD
from tokenomy.sim.loop import EventLoop
from tokenomy.sim.variants import make_variant

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
# keep_max_tool_s=0: every finished turn is offloaded to host (a swap beats recomputing 18k tokens)
BASE = SimConfig(instances=2, prefill=1, decode=1)


def deployment(variant: str = "ampd-reload") -> AMPD:
    cfg = make_variant(variant, BASE)
    cfg = replace(cfg, ampd=replace(cfg.ampd, retention_config=RetentionConfig(keep_max_tool_s=0.0)))
    ctx = SimContext(loop=EventLoop(), perf=PERF, config=cfg, done=lambda *_: None, slo=SLO(2.0, 0.1))
    return AMPD(ctx)


def turn(session: str, index: int, history: int, new: int = 300) -> Request:
    return Request(f"{session}:{index}", 0.0, history + new, 50, session_id=session, turn=index,
                   history_tokens=history, content=((hash(session) % 1000, history + new),))


def test_a_reload_is_priced_behind_the_reloads_already_on_the_pcie_link() -> None:
    dep = deployment()
    keeper, decode = dep._keeper, dep.decodes[0]
    assert keeper is not None
    for sid in ("a", "b"):  # both sessions' 18k-token histories go to host (nothing stays on the GPU)
        keeper.on_turn_end(turn(sid, 0, 0, 18_000), decode, 0.0, kv_tokens=18_000)
    one_s = 18_000 * PERF.kv_bytes_per_token / (PERF.gpu.pcie_bytes_per_s * PERF.tp)
    a, b = turn("a", 1, 18_000), turn("b", 1, 18_000)
    first = keeper.reload_estimate(a, decode, 1.0)
    assert first.tokens == 18_000 and first.ready_in_s == pytest.approx(one_s)
    ready_a, _ = keeper.reload(a, decode, 1.0)
    assert ready_a == pytest.approx(1.0 + one_s)
    # "b" arrives while "a"'s reload is on the link: it waits for it, then takes as long again
    est = keeper.reload_estimate(b, decode, 1.0 + one_s / 2)
    assert est.tokens == 18_000 and est.ready_in_s == pytest.approx(1.5 * one_s)
    ready_b, preloaded = keeper.reload(b, decode, 1.0 + one_s / 2)
    assert preloaded == 18_000 and ready_b == pytest.approx(1.0 + one_s / 2 + est.ready_in_s)  # as estimated


def test_nothing_to_reload_without_a_host_copy() -> None:
    dep = deployment()
    assert dep._keeper is not None
    assert dep._keeper.reload_estimate(turn("c", 1, 18_000), dep.decodes[0], 0.0) == HostReload(0, 0.0)


def test_ampd_reload_is_ampd_with_the_reload_priced() -> None:
    assert make_variant("ampd-reload", BASE).ampd == replace(make_variant("ampd", BASE).ampd, price_host_reload=True)
    assert not make_variant("ampd", BASE).ampd.price_host_reload  # off by default
