"""A pipeline's timeline and the gateway's statistics, as tables for a terminal."""

from __future__ import annotations

import datetime as dt

from castad_contracts import api
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text


def _clock(at: dt.datetime | None) -> str:
    return at.astimezone().strftime("%H:%M:%S.%f")[:-3] if at else ""


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else ""


def _what(entry: api.TimelineEntry) -> str:
    """What an entry says beyond its step and status."""
    said = []
    if entry.worker:
        said.append(f"on {entry.worker}")
    if entry.error:
        said.append(f"{entry.error.code}: {entry.error.message}")
    if entry.next_attempt_at:
        said.append(f"next at {_clock(entry.next_attempt_at)}")
    if entry.actor:
        said.append(f"by {entry.actor}" + (f" (key {entry.actor_key_name})" if entry.actor_key_name else ""))
    if entry.reason and not entry.error:
        said.append(f"“{entry.reason}”")
    if entry.resume:
        said.append(f"from {entry.resume.value}")
    if entry.dead_letter is not None:
        said.append(f"dead letter {entry.dead_letter}")
    if entry.detail:
        said.append(entry.detail)
    if entry.artifact:
        said.append(f"{entry.artifact.download} ({entry.artifact.size:,} B)")
    return ", ".join(said)


def timeline(shown: api.PipelineTimeline) -> Group:
    trace = f", trace {shown.trace_url or shown.trace_id}" if shown.trace_id else ""
    entries = _table(f"{shown.id}: {shown.status}{trace}", "seq", "time", "step", "status", "pipeline", "what")
    for entry in shown.entries:
        status = entry.status if entry.attempt is None else f"{entry.status} #{entry.attempt}"
        entries.add_row(
            str(entry.seq), _clock(entry.time), entry.step, status, entry.pipeline_status, Text(_what(entry))
        )
    attempts = _table("attempts", "stage", "#", "worker", "took", "outcome", "error")
    for attempt in shown.attempts:
        error = f"{attempt.error_code}: {attempt.error_message}" if attempt.error_code else ""
        attempts.add_row(
            attempt.stage.value,
            str(attempt.attempt),
            attempt.worker or "?",
            _seconds(attempt.duration_s),
            attempt.outcome,
            Text(error),
        )
    return Group(entries, attempts)


# Columns that wrap in a narrow terminal, and their least width; every other keeps each value on one line.
WRAPPED = {"what": 20, "error": 16, "errors": 20, "worker": 12}
NUMBERS = (
    "pipelines",
    "calls l/s/v",
    "song s",
    "video s",
    "stored",
    "cost",
    "seq",
    "#",
    "took",
    "pending",
    "running",
    "retry wait",
    "stuck",
    "succeeded",
    "failed",
    "canceled",
)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        numeric = column in NUMBERS or column in ("failure", "attempts", "running") or column.startswith("p50")
        wrapped = column in WRAPPED
        table.add_column(
            column,
            justify="right" if numeric else "left",
            no_wrap=not wrapped,
            overflow="fold" if wrapped else "ellipsis",  # a long word (a worker, a URL) folds, never cut
            min_width=WRAPPED.get(column),
        )
    return table


def _percentiles(values: api.Percentiles | None) -> str:
    return f"{values.p50:.1f} / {values.p95:.1f} / {values.p99:.1f}" if values else ""


def _rate(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else ""


def usage(used: api.Usage) -> Group:
    whose = used.tenant or "every tenant"
    lines: list[Text | Table] = [Text(f"{whose}, {used.from_} to {used.to} (UTC), costs in {used.currency}")]
    if used.weight is not None:
        lines.append(Text(f"weight in the stages' fair turns: {used.weight}"))
    days = _table("per day", "day", "tenant", *USAGE_COLUMNS)
    for day in used.days:
        days.add_row(str(day.day), day.tenant, *_meters(day))
    days.add_row("total", "", *_meters(used.total))
    lines.append(days)
    if used.budgets:
        budgets = _table("budgets", "period", "limit", "used", "resets")
        for budget in used.budgets:
            for name, limit, value in (
                ("pipelines", budget.pipelines, budget.used.pipelines),
                ("song seconds", budget.song_seconds, budget.used.song_seconds),
                ("cost", budget.cost, budget.used.estimated_cost),
            ):
                if limit is not None:
                    budgets.add_row(budget.period, f"{name} {limit:g}", f"{value:g}", _clock(budget.resets_at))
        lines.append(budgets)
    return Group(*lines)


USAGE_COLUMNS = ("pipelines", "calls l/s/v", "song s", "video s", "stored", "cost")


def _meters(meters: api.Meters) -> tuple[str, ...]:
    calls = f"{meters.lyric_calls}/{meters.song_calls}/{meters.video_calls}"
    stored = f"{meters.stored_bytes / 1e6:.1f} MB"
    return (
        str(meters.pipelines),
        calls,
        f"{meters.song_seconds:.0f}",
        f"{meters.video_seconds:.0f}",
        stored,
        f"{meters.estimated_cost:.2f}",
    )


def stats(numbers: api.Stats) -> Group:
    pipelines = numbers.pipelines
    flight = ", ".join(f"{status} {n}" for status, n in sorted(pipelines.in_flight_by_status.items()))
    ended = ", ".join(f"{status} {n}" for status, n in sorted(pipelines.finished.items())) or "none"
    per_minute = numbers.throughput.per_minute
    lines = [
        Text(f"since {_clock(numbers.since)} ({numbers.window_s // 60} min), read at {_clock(numbers.at)}"),
        Text(f"in flight: {pipelines.in_flight}" + (f" ({flight})" if flight else "")),
        Text(f"created: {pipelines.created}; ended: {ended}"),
        Text("per minute: " + ", ".join(f"{name} {rate:.2f}" for name, rate in per_minute.items())),
    ]
    now = _table("stages now", "stage", "pending", "running", "retry wait", "stuck")
    runs = _table("runs ended in the window", "stage", "succeeded", "failed", "canceled", "failure", "p50/p95/p99 s")
    attempts = _table("attempts ended in the window", "stage", "attempts", "p50/p95/p99 s", "errors")
    for stage in numbers.stages:
        name = stage.stage.value
        now.add_row(name, *(str(n) for n in (stage.pending, stage.running, stage.retry_waiting, stage.stuck)))
        runs.add_row(
            name,
            *(str(n) for n in (stage.succeeded, stage.failed, stage.canceled)),
            _rate(stage.failure_rate),
            _percentiles(stage.duration_s),
        )
        errors = ", ".join(f"{error.code} {error.count} ({error.rate:.0%})" for error in stage.errors)
        attempts.add_row(name, str(stage.attempts), _percentiles(stage.attempt_duration_s), Text(errors))
    parts: list[Text | Table] = [*lines, now, runs, attempts]
    if numbers.stuck:
        stuck = _table(f"stuck (running longer than {numbers.stuck_after_s:g} s)", "pipeline", "stage", "attempt")
        stuck.add_column("worker")
        stuck.add_column("running", justify="right")
        for one in numbers.stuck:
            stuck.add_row(
                one.pipeline_id, one.stage.value, str(one.attempt), one.worker or "?", f"{one.running_s:.0f} s"
            )
        parts.append(stuck)
    reviews = numbers.reviews
    if reviews.waiting:
        waiting = _table(f"drafts waiting for review: {reviews.waiting}", "pipeline", "drafted", "waiting", "until")
        for draft in reviews.oldest:
            waiting.add_row(
                draft.pipeline_id, _clock(draft.drafted_at), f"{draft.waiting_s:.0f} s", _clock(draft.review_until)
            )
        parts.append(waiting)
    letters = numbers.dead_letters
    open_ = ", ".join(f"{kind} {n}" for kind, n in sorted(letters.open.items())) or "none"
    parts.append(Text(f"dead letters open: {open_}"))
    return Group(*parts)
