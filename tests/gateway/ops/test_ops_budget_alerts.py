"""Budget alerts and refusals as an operator reads them: threshold alerts on settled spend, once
each and in increasing order; a refusal is its own alert with the figures that refused; both, and
the client's 429, name the node by its name and its id."""

from __future__ import annotations

import asyncio

import pytest

from helpers.ops_factory import FakeClock, add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.guard import SettledUsage
from tokenomy.gateway.ops.tenancy import NodeLimits

WORST_USD = 100e-6 + 200e-6  # prompt 100 at $1/M + max_tokens 100 at $2/M (helpers.ops_factory's prices)
FULL = SettledUsage(100, 100, 0, WORST_USD)  # a request that cost its worst case


def _alerts(guard, kind: str) -> list:  # type: ignore[no-untyped-def]
    return [a for a in guard.alerter.recent if a.kind == kind]


def test_holds_in_flight_do_not_fire_thresholds_and_thresholds_come_in_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The live demo's case: requests in flight hold the whole budget, the next is refused while
    nothing is settled yet; the thresholds then fire as the spend settles: 50, 80, 100%."""
    clock = FakeClock()
    guard = make_guard(tmp_path, clock)
    raw, key_id = add_key(guard, org=NodeLimits(budget_usd=4 * WORST_USD, budget_period="day"),
                          org_name="skunkworks")
    org = guard.store.tree.path_nodes(key_id)[0]
    flights = [asyncio.run(guard.admit(request(raw, f"r{i}"))) for i in range(4)]
    with pytest.raises(GatewayError) as refused:
        asyncio.run(guard.admit(request(raw, "r4")))
    assert refused.value.headers["retry-after"] == "1"  # the holds will go: retry soon
    assert _alerts(guard, "budget_threshold") == []  # nothing is spent yet
    [refusal] = _alerts(guard, "budget_refusal")
    assert refusal.subject == org.id
    assert refusal.message == (f"org skunkworks ({org.id}) refused a request: spent $0.0000 + held $0.0012 "
                               f"of $0.0012 this day; the request may cost up to $0.0003")
    assert refusal.data["held_usd"] == pytest.approx(4 * WORST_USD) and refusal.data["spent_usd"] == 0.0

    for adm in flights:
        clock.advance(1.0)
        asyncio.run(guard.settle(adm, FULL))
    got = [(a.subject, a.data["threshold"], a.message) for a in _alerts(guard, "budget_threshold")]
    assert got == [
        (org.id, 0.5, f"org skunkworks ({org.id}) spent 50% of its day budget ($0.0006 of $0.0012)"),
        (org.id, 0.8, f"org skunkworks ({org.id}) spent 80% of its day budget ($0.0012 of $0.0012)"),
        (org.id, 1.0, f"org skunkworks ({org.id}) spent 100% of its day budget ($0.0012 of $0.0012)"),
    ]
    # Spent out now: refused again, but the refusal was reported once this period.
    with pytest.raises(GatewayError) as again:
        asyncio.run(guard.admit(request(raw, "r5")))
    assert again.value.headers["x-should-retry"] == "false"
    assert len(_alerts(guard, "budget_refusal")) == 1


def test_budget_refusal_names_the_node_by_name_and_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard, key=NodeLimits(budget_usd=WORST_USD / 2, budget_period="day"))
    with pytest.raises(GatewayError) as err:
        asyncio.run(guard.admit(request(raw, "a")))
    assert str(err.value.message).startswith(f"budget exceeded for key key ({key_id}): this request may cost up to")
