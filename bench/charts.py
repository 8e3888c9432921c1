"""SVG charts for the generated reports: the same measurements always give the same file.

Figures are made with matplotlib's object interface (no pyplot, so no GUI backend is ever chosen) and
saved with a fixed hash salt for the ids SVG elements get and without a date, so a report written again
from the same measurements leaves its charts unchanged in git.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

SIZE = (7.0, 3.2)  # inches: the width of the docs site's text column at its default zoom
STYLE = {
    "svg.hashsalt": "castad",  # element ids from a fixed salt instead of a random one
    "svg.fonttype": "path",  # glyphs drawn as paths: the same picture whatever fonts the reader has
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


def _finish(axes: Axes, title: str, unit: str) -> None:
    axes.set_title(title, loc="left")
    axes.set_ylabel(unit)
    axes.grid(axis="y", linewidth=0.4, alpha=0.5)
    axes.legend(frameon=False)


def _svg(figure: Figure) -> str:
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()
