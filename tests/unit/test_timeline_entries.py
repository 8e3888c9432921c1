"""A timeline as clients see it: entries, their gateway links, and where the stream of every pipeline may go."""

from __future__ import annotations

import datetime as dt

from castad_api import records, timeline
from castad_api.timeline import Position
from castad_contracts import api

PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
NOW = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)
ARTIFACT = {"uri": "file:///var/a/song.wav", "sha256": "a" * 64, "size": 9, "media_type": "audio/wav"}


def row(seq: int, event_type: str, data: dict) -> records.Entry:
    return records.Entry(seq=seq, event_type=event_type, data=data, time=NOW, number=seq)


def test_every_gap_in_the_entries_is_waited_for_before_the_stream_goes_past_it():
    # Contiguous: everything goes.
    assert timeline.settle(Position(10), [11, 12, 13], now=100.0, wait_s=5) == Position(13)
    # 12 is missing: stop before it and start waiting.
    assert timeline.settle(Position(10), [11, 13, 14], now=100.0, wait_s=5) == Position(11, 100.0)
    # Still missing, not long enough: still waiting since then.
    assert timeline.settle(Position(11, 100.0), [13, 14], now=104.9, wait_s=5) == Position(11, 100.0)
    # It came (its transaction committed): on in order.
    assert timeline.settle(Position(11, 100.0), [12, 13, 14], now=104.9, wait_s=5) == Position(14)
    # Never came (rolled back): past it after the wait; a later gap is waited for afresh.
    assert timeline.settle(Position(11, 100.0), [13, 14, 16], now=105.0, wait_s=5) == Position(14, 105.0)
    # Nothing after it: no gap to wait for.
    assert timeline.settle(Position(14), [], now=200.0, wait_s=5) == Position(14)


def test_an_entry_shows_artifacts_by_their_gateway_links_and_tells_a_retrys_budgets_from_a_retryings_last_attempt():
    completed = timeline.entry(
        PIPELINE, row(5, "song.completed", {"step": "song", "status": "completed", "artifact": ARTIFACT})
    )
    assert completed["artifact"]["download"] == f"/v1/pipelines/{PIPELINE}/artifacts/song"
    assert "uri" not in completed["artifact"]
    ended = timeline.entry(PIPELINE, row(9, "song.completed", {"step": "pipeline", "artifacts": {"song": ARTIFACT}}))
    assert (
        ended["artifacts"]["song"]["download"].endswith("/artifacts/song") and "uri" not in ended["artifacts"]["song"]
    )

    retrying = timeline.entry(PIPELINE, row(3, "song.retrying", {"step": "song", "max_attempts": 5}))
    retry = timeline.entry(
        PIPELINE, row(8, "pipeline.retry_requested", {"step": "pipeline", "max_attempts": {"song": 7}})
    )
    assert (retrying["max_attempts"], retrying["attempt_budgets"]) == (5, None)
    assert (retry["max_attempts"], retry["attempt_budgets"]) == (None, {"song": 7})
    assert (retry["seq"], retry["time"], retry["event_type"]) == (8, NOW, "pipeline.retry_requested")


def test_operator_actions_are_the_cancels_retries_and_dead_letter_replays_and_discards():
    base = {"seq": 1, "time": NOW, "event_type": "x", "step": "pipeline", "pipeline_status": "RUNNING", "progress": 0}
    for status in ("cancel_requested", "retry_requested", "dead_letter_replayed", "dead_letter_discarded"):
        done = timeline.action(api.TimelineEntry(**base, status=status, actor="ops"))
        assert done is not None and (done.action, done.actor) == (status, "ops")
    for status in ("requested", "started", "canceled", "dead_letter_recorded"):
        assert timeline.action(api.TimelineEntry(**base, status=status)) is None


def test_a_trace_link_needs_both_a_template_and_a_trace():
    template = "http://127.0.0.1:16686/trace/{trace_id}"
    assert timeline.trace_url(template, "ab" * 16) == f"http://127.0.0.1:16686/trace/{'ab' * 16}"
    assert timeline.trace_url(None, "ab" * 16) is None
    assert timeline.trace_url(template, None) is None
