"""A P:D split of a cluster's instances (``0:D`` only for AMPD: ``sim.variants.runs_without_prefill``)."""

from __future__ import annotations

Split = tuple[int, int]
"""(prefill instances, decode instances)."""


def parse_split(text: str, where: str | None = None) -> Split:
    """``"P:D"`` with ``D >= 1`` and ``P >= 0`` (``P = 0`` only for AMPD: checked where the
    deployment is known, :class:`DeploymentSpec` and :class:`ExperimentSpec`)."""
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"bad split {where or text!r}: expected P:D, e.g. 2:6") from None
    if p < 0 or d < 1:
        raise ValueError(f"bad split {where or text!r}: needs >= 1 decode instance and >= 0 prefill "
                         "(0 only for AMPD)")
    return p, d
