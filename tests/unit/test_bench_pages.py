"""What the benchmarks share (bench/pages.py): their options, the measurements kept, the page written from them."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from typing import Any

import pytest
from castad_testkit import scratch

from bench import pages


def _page(measured: dict[str, Any]) -> str:
    return f"{measured['rate']} a second\n"


def test_a_benchmark_is_given_render_and_its_page_beside_its_own_options() -> None:
    parser = pages.arguments("quota", "Claims a second.")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args([])
    assert parser.prog == "python -m bench.quota"
    assert (args.render, args.output, args.rounds) == (False, scratch.REPORTS / "quota.md", 3)
    assert "write the page again from quota.json, run nothing" in parser.format_help()
    assert parser.parse_args(["--render", "--output", "elsewhere.md"]).output == pathlib.Path("elsewhere.md")


def test_measurements_are_kept_beside_the_page_and_the_page_written_from_what_is_kept(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "reports" / "quota.md"
    kept = pages.write(page, _page, {"rate": 12.5, "date": dt.date(2026, 12, 8)})
    assert kept == {"rate": 12.5, "date": "2026-12-08"}  # as the JSON keeps it, the date as its text
    assert json.loads(page.with_suffix(".json").read_text()) == kept
    assert page.read_text() == "12.5 a second\n"
    assert capsys.readouterr().out == f"written to {page}\n"


def test_render_writes_the_page_again_from_the_kept_measurements_alone(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "quota.md"
    page.with_suffix(".json").write_text(json.dumps({"rate": 7}))
    assert pages.write(page, _page) == {"rate": 7}
    assert page.read_text() == "7 a second\n"


def test_render_before_any_run_says_so_in_one_line_and_writes_nothing(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "quota.md"
    with pytest.raises(SystemExit, match="quota.json holds no measurements yet: run the benchmark once without"):
        pages.write(page, _page)
    assert not page.exists()
