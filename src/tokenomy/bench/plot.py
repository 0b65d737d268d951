"""The bench's chart: every request's TTFT and TPOT against the time it was sent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenomy.core import SLO, RequestRecord
from tokenomy.metrics.report import save_figure


def plot_timeline(records: Sequence[RequestRecord], slo: SLO, path: str | Path) -> Path:
    """Save a PNG with two panels (TTFT, TPOT in ms, log scale) of finished requests over send
    time, the SLO bounds as dashed lines and failed requests marked on the time axis."""
    if not records:
        raise ValueError("plot_timeline needs at least one request")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.finished and r.ttft_s is not None]
    failed = [r.arrival_s for r in records if not r.finished]
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    panels = [("TTFT (ms)", [r.ttft_s for r in ok], slo.ttft_s),
              ("TPOT (ms)", [r.tpot_s for r in ok], slo.tpot_s)]
    for ax, (label, ys, bound) in zip(axes, panels, strict=True):
        ax.scatter([r.arrival_s for r in ok], [(y or 0.0) * 1e3 for y in ys], s=6, alpha=0.6)
        ax.axhline(bound * 1e3, linestyle="--", color="grey", label=f"SLO {bound * 1e3:g} ms")
        if failed:
            ax.scatter(failed, [bound * 1e3] * len(failed), marker="x", color="red", label="failed")
        ax.set_ylabel(label)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("request sent at (s since start)")
    return save_figure(plt, fig, path)
