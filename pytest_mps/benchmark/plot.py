"""Box plots and histograms of each group's rounds, through matplotlib (optional).

The box is drawn from the statistics every result carries (quartiles, and the
1.5 IQR whiskers pytest-benchmark computes); the histogram from the rounds,
which every result of up to 10,000 rounds carries in the session.
``--mps-benchmark-histogram`` checks at start-up that matplotlib is there
(``pip install 'pytest-mps[plot]'``).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_mps.benchmark.records import Table
from pytest_mps.benchmark.report import groups, time_unit

Entry = Mapping[str, Any]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", text).strip("_")[:80] or "all"


def _box(entry: Entry, scale: float, label: str) -> dict[str, Any]:
    stats = entry["stats"]
    low, high = stats["ld15iqr"], stats["hd15iqr"]
    data = stats.get("data") or []
    return {
        "label": label,
        "med": stats["median"] / scale,
        "q1": stats["q1"] / scale,
        "q3": stats["q3"] / scale,
        "whislo": low / scale,
        "whishi": high / scale,
        "fliers": [v / scale for v in data if v < low or v > high],
    }


def _describe(entry: Entry, scale: float, unit: str) -> str:
    stats = entry["stats"]
    beyond = stats.get("iqr_outliers", 0)
    share = stats["iqr"] / stats["median"] if stats["median"] else 0.0
    return (
        f"{entry['name']}:  median {stats['median'] / scale:,.4g} {unit}, "
        f"IQR {stats['iqr'] / scale:,.3g} {unit} ({share:.1%}), "
        f"{stats['rounds']:,} rounds, {beyond:,} beyond the whiskers"
    )


def box_plots(entries: Sequence[Entry], prefix: Path, table: Table) -> list[Path]:
    """One PNG per group, ``PREFIX-<group>.png``; the paths written.

    Each benchmark gets its own row and its own time axis, spanning its
    whiskers: the rounds between them as a histogram, the quartiles as a box
    above it. A shared axis would flatten a 2 us result next to a 300 us one.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is all we make
    import matplotlib.pyplot as plt

    written = []
    for group, members in groups(entries, table):
        scale, unit = time_unit(min(e["stats"]["min"] for e in members))
        if table.time_unit != "auto":
            scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[table.time_unit]
            unit = table.time_unit
        fig, axes = plt.subplots(
            len(members),
            1,
            figsize=(8, 0.4 + 1.25 * len(members)),
            layout="constrained",
            squeeze=False,
        )
        for ax, entry in zip(axes[:, 0], members, strict=True):
            box = _box(entry, scale, "")
            low, high = box["whislo"], box["whishi"]
            data = [v / scale for v in entry["stats"].get("data") or []]
            inside = [v for v in data if low <= v <= high]
            if inside:
                ax.hist(inside, bins=40, color="#9dc3e6", edgecolor="none")
            # With a histogram the box sits above it; alone, mid-row.
            top = ax.get_ylim()[1] if inside else 1.0
            middle, width = (top * 1.25, top * 0.3) if inside else (0.75, 0.5)
            ax.bxp(
                [box],
                positions=[middle],
                widths=[width],
                orientation="horizontal",
                showfliers=False,
                patch_artist=True,
                manage_ticks=False,
                boxprops={"facecolor": "#cfe2f3", "edgecolor": "#1f4e79"},
                medianprops={"color": "#c00000", "linewidth": 2},
            )
            span = (high - low) or abs(high) or 1.0
            ax.set_xlim(low - 0.05 * span, high + 0.05 * span)
            ax.set_ylim(0, top * 1.5)
            if not inside and entry["stats"]["rounds"] > 0:
                ax.text(
                    0.5,
                    0.25,
                    "rounds not kept in the session (over 10,000): quartiles only",
                    transform=ax.transAxes,
                    ha="center",
                    fontsize=7,
                    color="#555555",
                )
            ax.set_yticks([])
            ax.set_title(_describe(entry, scale, unit), fontsize=8, loc="left")
            ax.tick_params(axis="x", labelsize=8)
        axes[-1, 0].set_xlabel(
            f"time per call ({unit}); each row on its own axis, whisker to whisker",
            fontsize=8,
        )
        fig.suptitle(f"pytest-mps benchmark: {group or 'all benchmarks'}", fontsize=10)
        path = prefix.parent / f"{prefix.name}-{_slug(group or 'all')}.png"
        _save(fig, path)
        plt.close(fig)
        written.append(path)
    return written


def _save(fig: Any, path: Path) -> None:
    """Write the figure to ``path`` whole, readable as a file made by open()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for secrets
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
