"""Retention's pure parts.

A pruner's rounds of bounded batches, the gateway's refusals at the edge of what the stages keep, and settings that
refuse combinations which would lose what a pipeline needs.
"""

from __future__ import annotations

import datetime as dt
import time

import pydantic
import pytest
from castad_api import retention as api_retention
from castad_api import settings as api_settings
from castad_runtime import metrics as runtime_metrics
from castad_runtime import retention, settings

HOUR = dt.timedelta(hours=1)
ENDED = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
POLICY = api_retention.Policy(
    inbox_s=10 * 86_400,
    artifacts_s=30 * 86_400,
    timeline_s=30 * 86_400,
    pipelines_s=90 * 86_400,
    dead_letters_s=30 * 86_400,
    dead_letters_left_s=90 * 86_400,
    deadline_s=2 * 3600,
    images_s=7 * 86_400,
)


class Batches:
    """A step that has `left` things to delete and records each batch it was asked for."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.limits: list[int] = []

    def __call__(self, limit: int) -> int:
        self.limits.append(limit)
        done = min(limit, self.left)
        self.left -= done
        return done


def test_a_round_asks_for_batches_until_one_comes_back_short_scaled_by_the_rows_each_spans():
    rows, pipelines, nothing = Batches(25), Batches(7), Batches(0)
    pruner = retention.Pruner(
        [
            retention.Step("rows", rows),
            retention.Step("pipelines", pipelines, rows_each=5),
            retention.Step("x", nothing),
        ],
        interval_s=60,
        batch=10,
        pause_s=0,
    )

    assert pruner.run_once() == {"rows": 25, "pipelines": 7, "x": 0}
    assert rows.limits == [10, 20]  # the first came back full and quick: the backlog doubled the next
    assert pipelines.limits == [2, 4, 8]
    assert nothing.limits == [10]


class Clock:
    """A monotonic clock that each batch moves on by the next of `durations`."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations = durations
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the read after a batch
            self.now += self.durations.pop(0)
        return self.now


def test_a_backlog_doubles_the_batch_while_each_is_quick_up_to_the_most_and_a_slow_one_halves_it():
    rows = Batches(10**6)
    quick, slow = 0.01, 1.0
    clock = Clock([quick, quick, quick, quick, slow, slow, slow, quick, quick, quick])
    pruner = retention.Pruner(
        [retention.Step("rows", rows)],
        interval_s=60,
        batch=10,
        pause_s=0,
        max_batch=80,
        quick_s=0.25,
        busy_share=1.0,
        clock=clock,
    )

    def remove(limit: int) -> int:
        done = rows(limit)
        if len(rows.limits) == 10:
            pruner.stop()
        return done

    pruner.steps = [retention.Step("rows", remove)]
    pruner.run_once()

    assert rows.limits == [10, 20, 40, 80, 80, 40, 20, 10, 20, 40]


def test_batches_that_never_grow_when_the_most_is_the_batch():
    rows = Batches(35)
    pruner = retention.Pruner([retention.Step("rows", rows)], interval_s=60, batch=10, pause_s=0, max_batch=10)

    assert pruner.run_once() == {"rows": 35}
    assert rows.limits == [10, 10, 10, 10]


def test_after_a_long_batch_the_pause_is_so_long_that_deleting_took_at_most_its_share_of_the_time():
    rows = Batches(3 * 10)

    def slow(limit: int) -> int:
        time.sleep(0.02)
        return rows(limit)

    pruner = retention.Pruner(
        [retention.Step("rows", slow)], interval_s=60, batch=10, pause_s=0, max_batch=10, busy_share=0.25
    )
    started = time.monotonic()
    pruner.run_once()

    # Four batches (the last one empty) and a pause of three times each of the three full ones.
    assert time.monotonic() - started >= 4 * 0.02 + 3 * 3 * 0.02


def test_the_settings_say_what_retention_does_with_a_backlog():
    fields = settings.CommonSettings.model_fields
    batch, pause = fields["retention_batch"].description or "", fields["retention_pause_s"].description or ""

    assert f"{retention.QUICK_S:g} s" in batch and f"{retention.MAX_BATCH:,} rows" in batch
    assert retention.BUSY_SHARE == 0.2 and "a fifth of the time" in pause


def test_a_stopped_pruner_asks_for_no_further_batch():
    endless = Batches(10**9)
    pruner = retention.Pruner([retention.Step("rows", endless)], interval_s=60, batch=10, pause_s=0)

    def remove(limit: int) -> int:
        done = endless(limit)
        if len(endless.limits) == 3:
            pruner.stop()  # as a SIGTERM would, while a batch runs
        return done

    pruner.steps = [retention.Step("rows", remove)]
    assert pruner.run_once() == {"rows": 10 + 20 + 40}
    assert endless.limits == [10, 20, 40]


def test_a_retry_is_refused_once_a_stage_ended_too_long_ago_for_a_run_to_finish_before_its_files_go():
    finished = {"lyric": ENDED, "song": ENDED + dt.timedelta(minutes=5)}
    last_chance = ENDED + dt.timedelta(days=30) - 2 * HOUR - api_retention.MARGIN_S * dt.timedelta(seconds=1)

    assert POLICY.retry_refusal(finished, last_chance - dt.timedelta(seconds=1)) is None
    refusal = POLICY.retry_refusal(finished, last_chance)
    assert refusal is not None
    assert "lyric stage ended at 2025-03-01 12:00:00 UTC" in refusal
    assert "CASTAD_RETENTION_ARTIFACTS_S" in refusal and "CASTAD_API_PIPELINE_DEADLINE_S" in refusal
    assert "30 days" in refusal and "2 h" in refusal
    assert POLICY.retry_refusal({}, last_chance + dt.timedelta(days=365)) is None  # no stage ended: nothing gone


def test_a_replay_is_refused_once_its_event_is_older_than_consumers_remember():
    last_chance = ENDED + dt.timedelta(days=10) - HOUR

    assert POLICY.replay_refusal(ENDED, last_chance - dt.timedelta(seconds=1)) is None
    refusal = POLICY.replay_refusal(ENDED, last_chance)
    assert refusal is not None and "CASTAD_RETENTION_INBOX_S" in refusal and "10 days" in refusal


def test_a_stages_files_count_as_gone_from_their_ttl_on():
    assert not POLICY.artifacts_gone(ENDED, ENDED + dt.timedelta(days=30) - dt.timedelta(seconds=1))
    assert POLICY.artifacts_gone(ENDED, ENDED + dt.timedelta(days=30))


def test_the_default_retention_settings_are_valid_in_every_service():
    common = settings.CommonSettings()
    api = api_settings.ApiSettings()
    assert common.retention_artifacts_s <= common.retention_jobs_s
    assert api.retention_policy().artifacts_s > api.pipeline_deadline_s


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"CASTAD_RETENTION_INBOX_S": 3600, "CASTAD_HOLD_EVENTS_S": 3600}, "CASTAD_RETENTION_INBOX_S must be longer"),
        ({"CASTAD_RETENTION_JOBS_S": 7200, "CASTAD_RETENTION_ARTIFACTS_S": 7201}, "CASTAD_RETENTION_JOBS_S must be"),
        ({"CASTAD_RETENTION_OUTBOX_S": 0}, "CASTAD_RETENTION_OUTBOX_S\n  Input should be greater than or equal to 60"),
    ],
)
def test_retention_settings_that_would_lose_what_is_needed_are_refused_in_every_service(values, named):
    with pytest.raises(pydantic.ValidationError, match=named):
        settings.CommonSettings(**values)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (
            {"CASTAD_RETENTION_ARTIFACTS_S": 7200, "pipeline_deadline_s": 7200},
            "CASTAD_RETENTION_ARTIFACTS_S must be longer than CASTAD_API_PIPELINE_DEADLINE_S",
        ),
        (
            {"retention_pipelines_s": 86_400, "retention_timeline_s": 2 * 86_400},
            "CASTAD_API_RETENTION_PIPELINES_S must be at least",
        ),
    ],
)
def test_gateway_settings_that_would_lose_what_a_pipeline_needs_are_refused(values, named):
    with pytest.raises(pydantic.ValidationError, match=named):
        api_settings.ApiSettings(**values)


def test_what_each_step_deletes_is_counted_batch_by_batch_for_the_metrics():
    registry = runtime_metrics.registry()
    pruner = retention.Pruner(
        [retention.Step("outbox rows", Batches(25)), retention.Step("files", Batches(0))],
        interval_s=60,
        batch=10,
        pause_s=0,
        measured=runtime_metrics.RetentionMetrics(registry, "lyric"),
    )

    pruner.run_once()

    def deleted(what: str) -> float | None:
        return registry.get_sample_value("castad_retention_deleted_total", {"service": "lyric", "what": what})

    assert (deleted("outbox rows"), deleted("files")) == (25.0, None)


def test_a_finished_round_is_told_for_the_alert_and_one_that_fails_is_not():
    registry = runtime_metrics.registry()
    measured = runtime_metrics.RetentionMetrics(registry, "song")

    def finished() -> float | None:
        return registry.get_sample_value("castad_retention_last_round_timestamp_seconds", {"service": "song"})

    started = finished()
    assert started is not None and abs(started - time.time()) < 60  # its start, before any round
    failing = retention.Pruner(
        [retention.Step("files", Failing())], interval_s=60, batch=10, pause_s=0, measured=measured
    )
    with pytest.raises(OSError):
        failing.run_once()
    assert finished() == started
    retention.Pruner(
        [retention.Step("outbox rows", Batches(3))], interval_s=60, batch=10, pause_s=0, measured=measured
    ).run_once()
    assert finished() > started


class Failing:
    """A step's deletion that fails every time (its store out)."""

    def __call__(self, limit: int) -> int:
        raise OSError("the artifact store did not answer")
