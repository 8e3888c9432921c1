"""The benchmarks' pages, written from their measurements by the templates in bench/templates.

Each page's words, headings and tables are its template's (`<page>.md.j2`); the benchmark passes the measurements
it keeps and what it derives from them. A name the template uses and the benchmark did not pass fails the page
(`jinja2.StrictUndefined`) instead of leaving a gap. Block tags take their line with them (`trim_blocks`,
`lstrip_blocks`), so a template's lines are the page's.

Every benchmark's command starts from `arguments` (its own options added to --render and --output) and ends with
`write`: the measurements of a run kept beside the page in <page>.json, the page written from what is kept, so
`--render` writes the same page from an earlier run's measurements without measuring anything.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
from collections.abc import Callable
from typing import Any

import jinja2
from castad_testkit import scratch

TEMPLATES = pathlib.Path(__file__).with_name("templates")


def number(value: float | None, digits: int = 1) -> str:
    """Return `value` with its thousands separated and `digits` decimals, or n/a for a figure not measured."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def fixed(value: float, digits: int = 1) -> str:
    """Return `value` with `digits` decimals and no thousands separator."""
    return f"{value:.{digits}f}"


def thousands(value: int) -> str:
    """Return the whole number `value` with its thousands separated."""
    return f"{value:,}"


def ratio(a: float | None, b: float | None) -> str:
    """Return a / b as a factor (1.25×), or n/a where either is missing or zero."""
    if not a or not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}×"


def percent(share: float | None) -> str:
    """Return a share (0.42) as a whole percentage (42%), or n/a where it was not measured."""
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _strict(format_: Callable[..., str]) -> Callable[..., str]:
    """Make a filter given a name the page was not given fail as printing the name would, not with a TypeError."""

    @functools.wraps(format_)
    def checked(*values: Any) -> str:
        for value in values:
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()
        return format_(*values)

    return checked


_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
for _name, _format in {"number": number, "fixed": fixed, "thousands": thousands, "percent": percent}.items():
    _ENVIRONMENT.filters[_name] = _strict(_format)
_ENVIRONMENT.globals["ratio"] = _strict(ratio)


def measured(kept: pathlib.Path) -> Any:
    """Return the measurements a benchmark kept in `kept`, or stop with one line saying how to make them."""
    try:
        return json.loads(kept.read_text())
    except FileNotFoundError:
        raise SystemExit(f"{kept} holds no measurements yet: run the benchmark once without --render") from None


def arguments(name: str, description: str | None) -> argparse.ArgumentParser:
    """Return benchmark `name`'s parser with --render and --output (its page); the benchmark adds its own options."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=description)
    parser.add_argument("--render", action="store_true", help=f"write the page again from {name}.json, run nothing")
    parser.add_argument(
        "--output",
        type=pathlib.Path,
        default=scratch.REPORTS / f"{name}.md",
        help="the page (default: %(default)s); the measurements are kept beside it, in the same name's .json",
    )
    return parser


def write(page: pathlib.Path, render: Callable[[Any], str], measurements: Any = None) -> Any:
    """Keep `measurements` (when given) beside `page`, write the page from what is kept and return what is kept.

    Without measurements (--render) the page is written from those kept by an earlier run, or nothing is written
    and the benchmark stops with one line saying how to make them (`measured`).
    """
    kept = page.with_suffix(".json")
    if measurements is not None:
        page.parent.mkdir(parents=True, exist_ok=True)
        # a value JSON has no form for (a date, a path) is kept as its text rather than losing the run at its end
        kept.write_text(json.dumps(measurements, indent=1, default=str) + "\n")
    found = measured(kept)
    page.write_text(render(found))
    print(f"written to {page}")
    return found


def render(template: str, /, **context: Any) -> str:
    """Return the page `template` (a file name in bench/templates) writes from `context`."""
    return _ENVIRONMENT.get_template(template).render(**context)
