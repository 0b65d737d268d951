"""The paired failover figures: their arithmetic on hand-made step times, and one real pair."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
import transformers  # noqa: F401 - part of the eaas extra: a missing one must fail here, not skip

from tokenomy.eaas.generation import Generation
from tokenomy.eaas.paired_failover import PairedFailoverConfig, pair_figures, run_paired_failover
from tokenomy.eaas.stats import quantile


def _gen(steps_ms: list[float]) -> Generation:
    return Generation(torch.zeros(1, len(steps_ms)), torch.zeros(len(steps_ms), 1, 1), sum(steps_ms) / 1000,
                      [s / 1000 for s in steps_ms])


def test_quantile_interpolates_like_numpy_and_rejects_nonsense() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(3.7)
    with pytest.raises(ValueError, match="non-empty"):
        quantile([], 0.5)


@pytest.mark.parametrize(
    ("killed_ms", "drop", "resent", "capacity"),
    [
        # no difference at all: nothing lost
        ([20, 10, 10, 10, 10, 10, 10, 10], 0.0, 0.0, 0.0),
        # the failover step (step 4 = k + 1) costs 5 ms more, later steps are alike
        ([20, 10, 10, 15, 10, 10, 10, 10], 5 / 55, 5 / 55, 0.0),
        # one server fewer makes every later step 1 ms slower; one scheduler stall (+40 ms) is ignored
        ([20, 10, 10, 10, 11, 51, 11, 11], 4 / 54, 0.0, 4 / 54),
    ],
)
def test_pair_figures_split_the_drop_into_resent_work_and_lost_capacity(
    killed_ms: list[float], drop: float, resent: float, capacity: float
) -> None:
    control = _gen([20, 10, 10, 10, 10, 10, 10, 10])
    got = pair_figures(control, _gen(killed_ms), k=3)
    assert got[0] == pytest.approx(drop) and got[2] == pytest.approx(resent) and got[3] == pytest.approx(capacity)
    assert got[0] == pytest.approx(got[2] + got[3])
    assert got[4] == pytest.approx(0.0)  # steps 2..3 are alike: no noise before the kill


def test_config_needs_a_replica_to_survive_the_kill() -> None:
    with pytest.raises(ValueError, match="replicas"):
        PairedFailoverConfig(n_servers=2, replicas=1)
    with pytest.raises(ValueError, match="kill_after_token"):
        PairedFailoverConfig(new_tokens=8, kill_after_token=8)


@pytest.mark.integration
def test_one_real_pair_keeps_the_tokens_and_reports_every_figure() -> None:
    r = run_paired_failover(PairedFailoverConfig(n_servers=2, replicas=2, pairs=1, batch=2, prompt_tokens=4,
                                                 new_tokens=8, kill_after_token=3))
    assert r.tokens_identical and r.max_abs_logit_err <= 1e-5
    (pair,) = r.per_pair
    assert pair["resent_tokens"] > 0 and pair["teardown_ms"] > 0
    assert r.drop_median == pytest.approx(pair["resent_part"] + pair["capacity_part"])
    assert {"pairs", "drop_median", "drop_p90", "tokens_identical"} <= set(r.to_json())
