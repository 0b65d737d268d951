"""Named deployment variants for comparisons and ablations.

Each variant maps a base :class:`SimConfig` to the configuration it runs: the baselines at
their best (colocated with the prefix-aware router or with session affinity; PD
disaggregation; both with AMPD's host KV tier, ``*-offload``), and AMPD with its mechanisms added one at a time for the ablation table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tokenomy.core.errors import UnknownNameError
from tokenomy.sim.config import AMPDOptions, SimConfig

Variant = Callable[[SimConfig], SimConfig]


def _ampd(binding: bool, placement: bool, reorder: bool, retention: bool, admission: bool = False) -> Variant:
    def make(base: SimConfig) -> SimConfig:
        opts = replace(
            base.ampd, binding=binding, placement=placement, reorder=reorder, retention=retention, admission=admission
        )
        return replace(base, deployment="ampd", ampd=opts)

    return make


def _link_blind(c: SimConfig) -> SimConfig:
    return replace(c, ampd=replace(c.ampd, link_aware=False))


def _placement(c: SimConfig, **changes: bool) -> SimConfig:
    return replace(c, ampd=replace(c.ampd, placement_config=replace(c.ampd.placement_config, **changes)))


def _fixed_chunk(c: SimConfig) -> SimConfig:
    return _placement(c, size_local_chunks=False)


VARIANTS: dict[str, Variant] = {
    "colocated": lambda c: replace(c, deployment="colocated", router="prefix_aware"),
    "colocated-affinity": lambda c: replace(c, deployment="colocated", router="session_affinity"),
    "disagg": lambda c: replace(c, deployment="disagg"),
    # Fair baselines: the same host KV tier, PCIe model and retention policies as AMPD.
    "colocated-offload": lambda c: replace(c, deployment="colocated", router="session_affinity", host_kv_tier=True),
    # Disaggregated prefill nodes balance better by prefix and load than by session (measured on GAIA).
    "disagg-offload": lambda c: replace(c, deployment="disagg", router="prefix_aware", host_kv_tier=True),
    "ampd-binding": _ampd(True, False, False, False),
    "ampd-binding-placement": _ampd(True, True, False, False),
    "ampd-binding-placement-reorder": _ampd(True, True, True, False),
    "ampd-fifo-admission": _ampd(True, True, True, True),
    "ampd": _ampd(True, True, True, True, True),
    # Ablation of the fifth round: placement blind to the KV ports' queueing.
    "ampd-link-blind": lambda c: _link_blind(_ampd(True, True, True, True, True)(c)),
    # Ablation of the sixth round: every local prefill in full local_budget_tokens chunks.
    "ampd-fixed-chunk": lambda c: _fixed_chunk(_ampd(True, True, True, True, True)(c)),
    # ... and the placement rule before it: a late increment runs locally even when slower.
    "ampd-late-local": lambda c: _placement(_ampd(True, True, True, True, True)(c), late_goes_local=True),
    # Seventh round, tried: a remote turn held past its TTFT deadline decodes on its prefill node.
    "ampd-lend": lambda c: replace(c, deployment="ampd",
                                   ampd=replace(_ampd(True, True, True, True, True)(c).ampd, lend_late_turns=True)),
    "ampd-borrow": lambda c: replace(c, deployment="ampd",
                                     ampd=replace(_ampd(True, True, True, True, True)(c).ampd, borrow_memory=True)),
    # Ninth round (point (c)): a first turn bound to an idle decode node prefills there in full
    # steps when the prefill pool is busy and that is sooner.
    "ampd-idle-first": lambda c: _placement(_ampd(True, True, True, True, True)(c), first_turn_on_idle_decode=True),
    # Ninth round: placement prices the PCIe reload of host-tier history (HostReload).
    "ampd-reload": lambda c: replace(c, deployment="ampd",
                                     ampd=replace(_ampd(True, True, True, True, True)(c).ampd, price_host_reload=True)),
    # Tenth round: local prefills in chunks the decode batch's banked TPOT slack allows (increments
    # and, while the prefill pool is queued, first turns).
    "ampd-bank": lambda c: _placement(_ampd(True, True, True, True, True)(c), tpot_bank=True),
    "ampd-bank-inc": lambda c: _placement(_ampd(True, True, True, True, True)(c), tpot_bank=True,
                                          tpot_bank_first_turns=False),  # ... for increments only
    # Eleventh round: with the bank, a local turn that would wait for memory moves to an instance with room.
    "ampd-bank-move": lambda c: _placement(replace(c, deployment="ampd", ampd=replace(
        _ampd(True, True, True, True, True)(c).ampd, move_held_turns=True)), tpot_bank=True),
    # Twelfth round (point (a)): a later turn queued behind prefill work on its instance moves to one
    # that starts it sooner (with ampd-bank-move's move of a turn that would wait for memory) ...
    "ampd-bank-turn": lambda c: _placement(replace(c, deployment="ampd", ampd=replace(
        _ampd(True, True, True, True, True)(c).ampd, move_held_turns=True, move_queued_turns=True)), tpot_bank=True),
    # ... the bank forward-looking (a young stream counts the tokens it is still expected to emit) ...
    "ampd-bank-ahead": lambda c: _placement(replace(c, deployment="ampd", ampd=replace(
        _ampd(True, True, True, True, True)(c).ampd, tpot_bank_forward=True)), tpot_bank=True),
    # ... and both.
    "ampd-turn-ahead": lambda c: _placement(replace(c, deployment="ampd", ampd=replace(
        _ampd(True, True, True, True, True)(c).ampd, move_held_turns=True, move_queued_turns=True,
        tpot_bank_forward=True)), tpot_bank=True),
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
