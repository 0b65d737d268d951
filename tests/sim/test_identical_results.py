"""The simulator's results on fixed seeds are those of commit 1728e6a (before its speed work).

Every metric of ``tokenomy sim``'s JSON for each case of ``helpers/identical_sim.py`` (colocated,
PD-disaggregated, AMPD, its option and its ablations, heterogeneous inventories, the closed-loop
gate, a horizon cut, KV-transfer timeouts) equals the stored one, numbers within 1e-9 relative
(only summation order may differ; docs/simulator.md, "Speed").

When the AMPD variants were reduced to one default, the stored entries were renamed, not
recomputed: 1728e6a's ``ampd-bank-turn@1:7`` is today's default ``ampd@1:7`` (``ampd_gaia_1_7``),
its ``ampd-turn-ahead@1:7`` today's ``ampd-forward-bank@1:7``, and its default ``ampd`` cases
today's ``ampd-itl-bound`` (``*_itl_bound_*``); the cases of deleted variants were dropped. Every
entry then gained ``ttft_p99_tpot_met_s`` (a new summary metric), computed by today's code in the
same run that matched every other stored number.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.identical_sim import CASES, MOONCAKE, differences

FIXTURE = Path(__file__).parent / "fixtures" / "identical_summaries.json"
EXPECTED = json.loads(FIXTURE.read_text())


def test_every_case_has_a_stored_result() -> None:
    assert sorted(EXPECTED) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_results_equal_the_stored_ones(name: str) -> None:
    case = CASES[name]
    if case.needs_trace and not MOONCAKE.exists():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE}")
    diffs = differences(EXPECTED[name], case.run())
    assert not diffs, f"{name} differs from 1728e6a in {len(diffs)} place(s): " + "; ".join(diffs[:10])


def test_differences_tolerates_only_tiny_relative_error() -> None:
    assert differences({"a": 1.0, "b": [2.0]}, {"a": 1.0 + 1e-12, "b": [2.0]}) == []
    assert differences({"a": 1.0}, {"a": 1.0 + 1e-6}) == [".a: 1.000001 != 1.0"]
    assert differences({"a": None}, {"a": 0.0}) != []
    assert differences({"a": 1}, {}) == [".a: missing"]
