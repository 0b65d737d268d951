"""Session binding: first choice by load and KV headroom, sticky turns, rebinding when KV runs out."""

from __future__ import annotations

import pytest
from policy_fakes import FakeView, make_request

from tokenomy.policy.ampd import BindingConfig, SessionBinder


def binder(**overrides: float) -> SessionBinder:
    return SessionBinder(BindingConfig(**overrides))


@pytest.mark.parametrize(
    ("views", "expected", "why"),
    [
        ([FakeView("a", num_running=8), FakeView("b", num_running=2)], "b", "least loaded"),
        # b is less loaded but would keep < 10% of its blocks free after this session
        ([FakeView("a", num_running=8), FakeView("b", num_running=2, free_blocks=150)], "a", "headroom"),
        # equal load: more free blocks left wins
        ([FakeView("a", free_blocks=500), FakeView("b", free_blocks=900)], "b", "headroom tie-break"),
        # nobody has headroom: most free blocks
        ([FakeView("a", free_blocks=90), FakeView("b", free_blocks=120)], "b", "no headroom"),
    ],
)
def test_first_binding_by_load_and_headroom(views: list[FakeView], expected: str, why: str) -> None:
    decision = binder().bind(make_request(prompt_tokens=1000, max_output_tokens=100), views, now=0.0)
    assert decision.instance_id == expected, why
    assert decision.new_binding and not decision.rebound


def test_binding_is_sticky_across_turns() -> None:
    b = binder()
    a, other = FakeView("a"), FakeView("b", num_running=5)
    assert b.bind(make_request(prompt_tokens=1000), [a, other], now=0.0).instance_id == "a"
    # a is now much busier than b, but holds the session's history: later turns return to it
    a.num_running, a.free_blocks, a.cached_tokens = 50, 400, 1100
    for turn, prompt in enumerate((1500, 2200, 3000), start=1):
        d = b.bind(
            make_request(prompt_tokens=prompt, history_tokens=prompt - 300), [a, other], now=float(turn)
        )
        assert (d.instance_id, d.rebound, d.new_binding) == ("a", False, False)
    assert b.bound_instance("s1") == "a"


def test_rebinds_when_bound_instance_runs_out_of_kv() -> None:
    b = binder()
    a, other = FakeView("a"), FakeView("b", num_running=5)
    b.bind(make_request(prompt_tokens=1000), [a, other], now=0.0)
    # turn 2 needs (5000 - 1000 cached + 100) / 16 = 257 blocks; a has 100 free
    a.free_blocks, a.cached_tokens = 100, 1000
    d = b.bind(make_request(prompt_tokens=5000, history_tokens=1100), [a, other], now=5.0)
    assert (d.rebound, d.from_instance, d.to_instance) == (True, "a", "b")
    assert "out of KV room" in d.reason
    assert d.move_history, "the history on a should follow the session to b"
    assert b.bound_instance("s1") == "b"
    # and the new binding is sticky in turn
    d = b.bind(make_request(prompt_tokens=5500, history_tokens=5100), [a, other], now=9.0)
    assert (d.instance_id, d.rebound) == ("b", False)


def test_rebinds_when_bound_instance_is_gone() -> None:
    b = binder()
    b.bind(make_request(), [FakeView("a")], now=0.0)
    d = b.bind(make_request(prompt_tokens=2000, history_tokens=1100), [FakeView("b"), FakeView("c")], now=1.0)
    assert (d.rebound, d.from_instance, d.instance_id) == (True, "a", "b")
    assert "gone" in d.reason
    assert not d.move_history  # nothing to fetch from an instance that is gone


def test_history_stays_behind_when_moving_it_is_switched_off() -> None:
    b = SessionBinder(BindingConfig(move_history_on_rebind=False))
    a, other = FakeView("a"), FakeView("b", num_running=5)
    b.bind(make_request(prompt_tokens=1000), [a, other], now=0.0)
    a.free_blocks, a.cached_tokens = 100, 1000
    d = b.bind(make_request(prompt_tokens=5000, history_tokens=1100), [a, other], now=5.0)
    assert (d.rebound, d.move_history) == (True, False)


def test_stays_when_no_other_instance_has_room() -> None:
    b = binder()
    a, other = FakeView("a"), FakeView("b", free_blocks=10)
    b.bind(make_request(), [a, other], now=0.0)
    a.free_blocks = 10
    d = b.bind(make_request(prompt_tokens=5000, history_tokens=1100), [a, other], now=1.0)
    assert (d.instance_id, d.rebound) == ("a", False)
    assert "stays" in d.reason


def test_unbind_and_stateless_requests() -> None:
    b = binder()
    b.bind(make_request(session_id="s"), [FakeView("a")], now=0.0)
    b.unbind("s")
    b.unbind("never-bound")
    assert b.bound_instance("s") is None
    d = b.bind(make_request(session_id=""), [FakeView("a")], now=0.0)
    assert d.instance_id == "a" and not d.new_binding
    assert b.bound_instance("") is None


@pytest.mark.parametrize("bad", [{"kv_headroom_fraction": 1.0}, {"rebind_headroom_fraction": -0.1}])
def test_config_bounds(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be in"):
        BindingConfig(**bad)


def test_no_decode_instance_fails() -> None:
    with pytest.raises(ValueError, match="no decode instances"):
        binder().bind(make_request(), [], now=0.0)


def test_idle_bindings_are_forgotten_and_the_binder_stays_bounded() -> None:
    """A long-running gateway binds sessions forever otherwise: a binding idle for idle_ttl_s is
    dropped, at most max_sessions are kept (least recently used out first); a session in use stays."""
    b = binder(idle_ttl_s=100.0, max_sessions=3)
    views = [FakeView("a"), FakeView("b")]
    for i, sid in enumerate(("s1", "s2", "s3")):
        b.bind(make_request(session_id=sid), views, now=float(i))
    b.bind(make_request(session_id="s1"), views, now=10.0)  # s1 used again: now the most recent
    b.bind(make_request(session_id="s4"), views, now=11.0)  # over the cap: s2 (least recent) goes
    assert [s for s in ("s1", "s2", "s3", "s4") if b.bound_instance(s)] == ["s1", "s3", "s4"]
    b.bind(make_request(session_id="s4"), views, now=105.0)  # s3 idle since 2.0: past the TTL
    assert b.bound_instance("s3") is None and b.bound_instance("s1") is not None
    b.bind(make_request(session_id="s4"), views, now=300.0)
    assert len(b) == 1 and b.bound_instance("s4") is not None
    fresh = b.bind(make_request(session_id="s1"), views, now=301.0)
    assert fresh.new_binding  # a forgotten session comes back as a new one
    for i in range(1000):
        b.bind(make_request(session_id=f"x{i}"), views, now=302.0)
    assert len(b) == 3
