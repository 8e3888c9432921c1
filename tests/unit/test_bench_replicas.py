"""The replicas part of the benchmark (bench/replicas.py): its rounds' order and its order checks."""

from __future__ import annotations

import datetime as dt
import pathlib
import subprocess
from typing import Any

import pytest
from castad_local import stack

from bench import replicas

T0 = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)


def _row(row_id: int, pipeline_id: str, routing_key: str, published_s: float | None) -> dict[str, Any]:
    published = None if published_s is None else T0 + dt.timedelta(seconds=published_s)
    return {"id": row_id, "pipeline_id": pipeline_id, "routing_key": routing_key, "published_at": published}


def test_rounds_alternate_so_that_only_every_other_round_switches() -> None:
    assert replicas.order(2) == [replicas.TWO, replicas.ONE, replicas.ONE, replicas.TWO]
    assert replicas.order(1) == [replicas.TWO, replicas.ONE]


def test_the_processes_are_one_gateway_and_each_worker_in_its_replicas() -> None:
    assert replicas.processes(2) == [
        "api",
        "relay-1",
        "relay-2",
        "lyric-1",
        "lyric-2",
        "song-1",
        "song-2",
        "video-1",
        "video-2",
    ]


def test_a_row_published_before_an_earlier_row_of_its_pipeline_is_a_finding() -> None:
    rows = [
        _row(1, "p1", "lyric.started", 1.0),
        _row(2, "p2", "lyric.started", 0.5),  # another pipeline's: any order
        _row(3, "p1", "lyric.completed", 1.0),  # one batch with the first: the same time
        _row(4, "p2", "lyric.completed", None),  # not published: told apart elsewhere
    ]
    assert replicas.published_in_order({"lyric": rows}) == []
    rows.append(_row(5, "p1", "lyric.progress", 0.9))
    assert replicas.published_in_order({"lyric": rows}) == [
        "p1: lyric's lyric.progress published before an earlier row"
    ]


def test_a_timeline_that_goes_back_in_the_saga_is_a_finding() -> None:
    kept = [
        ("p1", "pipeline.requested"),
        ("p1", "lyric.started"),
        ("p1", "lyric.completed"),
        ("p1", "song.started"),
        ("p1", "song.completed"),
        ("p1", "video.started"),
        ("p1", "video.completed"),
        ("p1", "pipeline.succeeded"),
    ]
    assert replicas.timelines_in_order(kept) == []
    assert replicas.timelines_in_order([("p2", "song.started"), ("p2", "lyric.completed")]) == [
        "p2: timeline entry lyric.completed after a later stage's"
    ]
    assert replicas.timelines_in_order([("p3", "lyric.completed"), ("p3", "lyric.started")]) == [
        "p3: timeline entry lyric.started after a later stage's"
    ]


def test_a_worker_id_or_a_relay_holder_names_the_process_that_runs_it(tmp_path: pathlib.Path) -> None:
    running = stack.Stack({}, tmp_path)
    process = subprocess.Popen(["sleep", "30"])
    try:
        running.processes["lyric-2"] = process
        assert running.process_of(f"lyric@host:{process.pid}") == "lyric-2"
        assert running.process_of(f"relay@host:{process.pid}/ab12cd34") == "lyric-2"
        with pytest.raises(LookupError):
            running.process_of(f"lyric@host:{process.pid + 100000}")
    finally:
        process.kill()
        process.wait()
