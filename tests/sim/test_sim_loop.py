"""The event loop's order (time, then the place an event took) and the driver's session starts,
fed to the loop one at a time in the places they would have taken all at once."""

from __future__ import annotations

from tokenomy.core import SLO, Session, Turn
from tokenomy.sim import SimConfig, runner, simulate
from tokenomy.sim.loop import EventLoop


def test_a_reserved_place_runs_where_it_was_taken_among_events_at_the_same_time() -> None:
    loop = EventLoop()
    ran: list[str] = []
    first = loop.reserve_seqs(2)  # places 0 and 1, before anything else is scheduled
    loop.at(1.0, ran.append, "scheduled after the reservation")
    loop.at(0.5, ran.append, "earlier")
    loop.at_in(1.0, first + 1, ran.append, "second reserved place")
    loop.at_in(1.0, first, ran.append, "first reserved place")
    loop.run()
    assert ran == ["earlier", "first reserved place", "second reserved place", "scheduled after the reservation"]
    assert loop.reserve_seq() == first + 4  # every place taken once


def _session(sid: str, start_s: float) -> Session:
    return Session(session_id=sid, start_s=start_s, turns=(Turn(prompt_tokens=64, output_tokens=4),))


def test_session_starts_wait_off_the_heap_and_arrive_in_the_order_of_the_whole_schedule(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Starts sorted by time, ties in the order the sessions were given (as if all had been
    scheduled at once); at most the next start is on the heap, whatever the trace's length."""
    sessions = [_session(f"s{i}", t) for i, t in enumerate([0.3, 0.1, 0.3, 0.0, 0.1, 0.0, 0.2] * 20)]
    arrived: list[str] = []
    pending: list[int] = []
    arrive = runner._Driver._arrive

    def spy(self: runner._Driver, session: Session, index: int) -> None:
        arrived.append(session.session_id)
        pending.append(self.loop.pending)
        arrive(self, session, index)

    monkeypatch.setattr(runner._Driver, "_arrive", spy)
    result = simulate(sessions, SimConfig(deployment="colocated", model="llama-3.1-8b", gpu="h100", instances=2), SLO())
    expected = [s.session_id for _, s in sorted(enumerate(sessions), key=lambda p: (p[1].start_s, p[0]))]
    assert arrived == expected
    assert len(result.records) == len(sessions)
    assert max(pending) < len(sessions) // 4  # (all at once, the first arrival saw 139 others queued)
