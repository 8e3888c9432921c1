"""SVG charts for the generated reports: the same measurements always give the same file.

Figures are made with matplotlib's object interface (no pyplot, so no GUI backend is ever chosen) and
saved with a fixed hash salt for the ids SVG elements get and without a date, so a report written again
from the same measurements leaves its charts unchanged in git.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.typing import RcKeyType

SIZE = (7.0, 3.2)  # inches: the width of the docs site's text column at its default zoom
STYLE: dict[RcKeyType, Any] = {
    "svg.hashsalt": "castad",  # element ids from a fixed salt instead of a random one
    "svg.fonttype": "none",  # text kept as text: smaller files, read by screen readers and searched in tests
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def grouped_bars(title: str, groups: Sequence[str], series: dict[str, Sequence[float | None]], *, unit: str) -> str:
    """Return an SVG chart of one bar per series in each group, each bar labelled with its value.

    A value of None leaves its bar out (a figure the series does not have).
    """
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=SIZE)
        axes = figure.subplots()
        width = 0.8 / max(len(series), 1)
        for index, (name, values) in enumerate(series.items()):
            placed = [(group, value) for group, value in enumerate(values) if value is not None]
            positions = [group + (index - (len(series) - 1) / 2) * width for group, _ in placed]
            bars = axes.bar(positions, [value for _, value in placed], width, label=name)
            axes.bar_label(bars, fmt="{:,.1f}", fontsize=7, padding=2)
        axes.set_xticks(range(len(groups)), list(groups))
        _finish(axes, title, unit)
        return _svg(figure)


def lines(title: str, xs: Sequence[float], series: dict[str, Sequence[float]], *, x_label: str, unit: str) -> str:
    """Return an SVG chart of one marked line per series over the same x values."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=SIZE)
        axes = figure.subplots()
        for name, values in series.items():
            axes.plot(list(xs), list(values), marker="o", markersize=3, label=name)
        axes.set_xticks(list(xs))
        axes.set_xlabel(x_label)
        axes.set_ylim(bottom=0)
        _finish(axes, title, unit)
        return _svg(figure)


def timeline(title: str, spans: Sequence[tuple[str, float, float, str]], *, unit: str) -> str:
    """Return an SVG chart of one row per span, top to bottom: (label, start, end, a note written after it).

    A span too short to see at the chart's scale is still marked where it starts.
    """
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(SIZE[0], 0.8 + 0.22 * len(spans)))
        axes = figure.subplots()
        rows = list(range(len(spans)))
        starts, ends = [start for _, start, _, _ in spans], [end for _, _, end, _ in spans]
        axes.barh(rows, [end - start for start, end in zip(starts, ends, strict=True)], left=starts, height=0.6)
        axes.plot(starts, rows, linestyle="none", marker="|", markersize=8, color="C0")
        for row, end, (_, _, _, note) in zip(rows, ends, spans, strict=True):
            axes.annotate(note, (end, row), xytext=(6, 0), textcoords="offset points", va="center", fontsize=7)
        axes.set_yticks(rows, [label for label, _, _, _ in spans], fontsize=7)
        axes.invert_yaxis()
        axes.set_xlim(0, 1.5 * max(ends, default=1.0))  # room for the notes after the last spans
        axes.set_xlabel(unit)
        axes.set_title(title, loc="left")
        axes.grid(axis="x", linewidth=0.4, alpha=0.5)
        return _svg(figure)


def _finish(axes: Axes, title: str, unit: str) -> None:
    axes.set_title(title, loc="left")
    axes.set_ylabel(unit)
    axes.grid(axis="y", linewidth=0.4, alpha=0.5)
    axes.legend(frameon=False)


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    return buffer.getvalue()
