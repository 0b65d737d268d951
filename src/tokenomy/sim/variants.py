"""Named deployments for comparisons and ablations.

Each variant maps a base :class:`SimConfig` to the configuration it runs:

* the baselines at their best: colocated with the prefix-aware router or with session affinity,
  PD disaggregation, and both with AMPD's host KV tier (``*-offload``);
* ``ampd``, the AMPD to run (every mechanism that won or tied at every point of the grid,
  docs/ampd-results.md), and ``ampd-forward-bank``, an option that helps where decodes have TPOT
  to spare and costs where they run at their SLO;
* ablations: ``ampd-itl-bound`` keeps every local prefill step within the ITL bound and every turn
  on its bound decode instance (no TPOT bank, no moves; with local chunk sizing also off it is
  what the live gateway runs, docs/ampd-live.md), and the ladder below it adds its mechanisms
  one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tokenomy.core.errors import UnknownNameError
from tokenomy.sim.config import AMPDOptions, SimConfig

Variant = Callable[[SimConfig], SimConfig]


def _ampd(base: SimConfig, *, tpot_bank_forward: bool = False) -> SimConfig:
    """AMPD with the five policy mechanisms on (whatever ``base`` switched off); the rest as ``base``
    sets them (by default: the TPOT bank and both moves on)."""
    opts = replace(base.ampd, binding=True, placement=True, reorder=True, retention=True, admission=True,
                   tpot_bank_forward=tpot_bank_forward)
    return replace(base, deployment="ampd", ampd=opts)


def _itl_bound(binding: bool, placement: bool, reorder: bool, retention: bool, admission: bool) -> Variant:
    """AMPD without the TPOT bank and the moves, with the mechanisms given switched on."""

    def make(base: SimConfig) -> SimConfig:
        opts = replace(base.ampd, binding=binding, placement=placement, reorder=reorder, retention=retention,
                       admission=admission, move_held_turns=False, move_queued_turns=False,
                       placement_config=replace(base.ampd.placement_config, tpot_bank=False))
        return replace(base, deployment="ampd", ampd=opts)

    return make


VARIANTS: dict[str, Variant] = {
    "colocated": lambda c: replace(c, deployment="colocated", router="prefix_aware"),
    "colocated-affinity": lambda c: replace(c, deployment="colocated", router="session_affinity"),
    "disagg": lambda c: replace(c, deployment="disagg"),
    # Fair baselines: the same host KV tier, PCIe model and retention policies as AMPD.
    "colocated-offload": lambda c: replace(c, deployment="colocated", router="session_affinity", host_kv_tier=True),
    # Disaggregated prefill nodes balance better by prefix and load than by session (measured on GAIA).
    "disagg-offload": lambda c: replace(c, deployment="disagg", router="prefix_aware", host_kv_tier=True),
    "ampd": lambda c: _ampd(c),
    "ampd-forward-bank": lambda c: _ampd(c, tpot_bank_forward=True),
    "ampd-itl-bound": _itl_bound(True, True, True, True, True),
    "ampd-binding": _itl_bound(True, False, False, False, False),
    "ampd-binding-placement": _itl_bound(True, True, False, False, False),
    "ampd-binding-placement-reorder": _itl_bound(True, True, True, False, False),
    "ampd-fifo-admission": _itl_bound(True, True, True, True, False),
}


def make_variant(name: str, base: SimConfig) -> SimConfig:
    try:
        return VARIANTS[name](base)
    except KeyError:
        raise UnknownNameError(f"unknown deployment {name!r}; known: {', '.join(VARIANTS)}") from None


def is_disaggregated(name: str) -> bool:
    return make_variant(name, SimConfig()).deployment != "colocated"


def runs_without_prefill(name: str) -> bool:
    """Whether variant ``name`` can run a ``0:D`` split: AMPD's placement (rule 1, docs/ampd.md)
    then prefills every turn on the session's own decode instance; PD disaggregation cannot."""
    return make_variant(name, SimConfig()).deployment == "ampd"


__all__ = ["VARIANTS", "AMPDOptions", "is_disaggregated", "make_variant", "runs_without_prefill"]
