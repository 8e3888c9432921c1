"""A pipeline's timeline as clients see it.

Entries with artifacts by their gateway links (never by where they are kept), numbered among their pipeline's
entries, attempts with their durations, the operators' actions, each as its viewer may see it (disclosure.py), and
the stream of every pipeline's entries, which waits for a gap in the entries' numbers to fill before it goes past
it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from castad_contracts import api, events

from castad_api import disclosure, records

ACTIONS = ("cancel_requested", "retry_requested", "dead_letter_replayed", "dead_letter_discarded")
RUNNING = "running"  # the outcome shown for an attempt that has not ended


def public(pipeline_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """A timeline entry's data as clients see it: artifacts by their gateway links."""
    shown = dict(data)
    if isinstance(data.get("artifact"), dict) and data.get("step") in set(events.Stage):
        shown["artifact"] = api.ArtifactLink.of(pipeline_id, events.Stage(data["step"]), data["artifact"]).model_dump()
    if isinstance(data.get("artifacts"), dict):
        shown["artifacts"] = {
            stage: api.ArtifactLink.of(pipeline_id, events.Stage(stage), artifact).model_dump()
            for stage, artifact in data["artifacts"].items()
        }
    return shown


def entry(
    pipeline_id: str, row: records.Entry | records.Scanned, viewer: disclosure.Viewer = disclosure.INTERNAL
) -> dict[str, Any]:
    """The fields of an api.TimelineEntry from a row of the timeline (number, event_type, data, time)."""
    shown = viewer.entry(pipeline_id, public(pipeline_id, row.data))
    budget = shown.pop("max_attempts", None)  # a retrying's last attempt, or a retry's budgets per stage
    return {
        **shown,
        "seq": row.number,
        "time": row.time,
        "event_type": row.event_type,
        "max_attempts": budget if isinstance(budget, int) else None,
        "attempt_budgets": budget if isinstance(budget, dict) else None,
    }


def attempt(row: records.Attempt, viewer: disclosure.Viewer = disclosure.INTERNAL) -> api.AttemptView:
    """An attempt from its row of pipeline_attempts, with its duration once it ended."""
    duration = None
    if row.started_at is not None and row.ended_at is not None:
        duration = (row.ended_at - row.started_at).total_seconds()
    return api.AttemptView(
        stage=events.Stage(row.stage),
        attempt=row.attempt,
        worker=viewer.worker(str(row.pipeline_id), row.worker),
        started_at=row.started_at,
        ended_at=row.ended_at,
        duration_s=duration,
        outcome=row.outcome or RUNNING,
        error_code=row.error_code,
        error_message=viewer.error_message(row.error_code, row.error_message),
    )


def action(shown: api.TimelineEntry) -> api.OperatorAction | None:
    if shown.status not in ACTIONS:
        return None
    return api.OperatorAction.model_validate({**shown.model_dump(), "action": shown.status})


def trace_url(template: str | None, trace_id: str | None) -> str | None:
    """The trace in a trace viewer (settings.ApiSettings.trace_url); None without a template or a trace."""
    if template is None or trace_id is None:
        return None
    return template.format(trace_id=trace_id)


def build(
    pipeline: records.Pipeline,
    rows: list[records.Entry],
    attempts: list[records.Attempt],
    more: bool,
    template: str | None,
    links: api.Links,
    viewer: disclosure.Viewer = disclosure.INTERNAL,
) -> api.PipelineTimeline:
    """The timeline from a page of its entries (`rows`, by number).

    Entries are numbered as the gateway learns of them, and events of different stages reach it in any order (the
    next stage may tell of its start before the previous one's end is applied): they are shown by the time each
    happened, seq breaking ties.
    """
    pipeline_id = str(pipeline.id)
    entries = [api.TimelineEntry.model_validate(entry(pipeline_id, row, viewer)) for row in rows]
    entries.sort(key=lambda shown: (shown.time, shown.seq))
    return api.PipelineTimeline(
        id=pipeline_id,
        status=pipeline.status,
        trace_id=pipeline.trace_id,
        trace_url=viewer.trace_url(trace_url(template, pipeline.trace_id)),
        entries=entries,
        next_after=rows[-1].number if more and rows else None,
        attempts=[attempt(row, viewer) for row in attempts],
        actions=[done for done in map(action, entries) if done is not None],
        links=links,
    )


def firehose_entry(row: records.Scanned, viewer: disclosure.Viewer = disclosure.INTERNAL) -> api.FirehoseEntry:
    """An entry of the stream of every pipeline (a row of timeline_rows.entries_of_all)."""
    pipeline_id = str(row.pipeline_id)
    return api.FirehoseEntry.model_validate(
        {
            **entry(pipeline_id, row, viewer),
            "pipeline_id": pipeline_id,
            "tenant": row.tenant,
            "customer_name": row.customer_name,
            "region": row.region,
        }
    )


@dataclasses.dataclass(frozen=True)
class Position:
    """Where the stream of every pipeline stands.

    Every entry up to `after` was looked at; `waiting_since` (monotonic seconds): since when the entry after it is
    missing while later ones are there.
    """

    after: int
    waiting_since: float | None = None


def settle(position: Position, seqs: list[int], now: float, wait_s: float) -> Position:
    """How far the stream may go over these entries (their seqs, ascending, all after position.after).

    Entries are numbered when written but seen when committed, and concurrent transactions commit in
    any order: a missing number may be an entry still to commit. The stream stops before it and waits,
    up to `wait_s`, then goes past it (its transaction was rolled back, or took far too long)."""
    after, waiting_since = position.after, position.waiting_since
    for seq in seqs:
        if seq != after + 1:
            if waiting_since is None:
                return Position(after, now)
            if now - waiting_since < wait_s:
                return Position(after, waiting_since)
        after, waiting_since = seq, None
    return Position(after, None)
