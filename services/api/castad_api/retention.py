"""What the gateway deletes of its own, and what it refuses because retention deleted, or will delete, it.

The gateway's retention (steps run by castad_runtime.retention's Pruner) deletes:
- published outbox rows and handled event ids, as every service does (CASTAD_RETENTION_OUTBOX_S, _INBOX_S);
- the timeline of a pipeline that ended, CASTAD_API_RETENTION_TIMELINE_S after it ended;
- a pipeline that ended, CASTAD_API_RETENTION_PIPELINES_S after it ended: its row (with its Idempotency-Key),
  its stages and their attempts, what is left of its timeline, its webhook notices and their tries; never
  while a notice is still being tried;
- dead letters replayed or discarded, with their actions, CASTAD_API_RETENTION_DEAD_LETTERS_S after the
  last action on them (one still dead is kept);
- the creation counts of API keys, once their minute is over, and the upload buckets of tenants, once full again;
- an uploaded image no pipeline names, CASTAD_API_RETENTION_IMAGES_S after its last upload: its file, then its
  record (`forget_images`). One a pipeline names (a photo, its brand's logo) is kept while that pipeline is, and
  a brand kit's logo while the kit shows it: found named, it is looked at again a period later (then, at most that
  long after the last pipeline or kit naming it was deleted, it goes).
A pipeline that has not ended is never touched.

An image is chosen for deletion with its row locked, and only if no pipeline names it by a check made once the
lock is held (a statement of its own, whose snapshot sees every pipeline committed before): a pipeline created at
the same moment locks the images it names (uploaded.tenant_images), so either retention skips it, or the creation
waits for the choice to commit and then finds no such image (422). The choice (`images.deleting_since`) commits
before the file goes, outside any transaction; the row goes after it. An upload of the same bytes meanwhile finds
the image chosen and waits a few seconds for its row to go (then answers 503 with Retry-After), then records and
keeps the file anew under a new record. The same bytes uploaded twice by a tenant are one record
(images_tenant_sha256), so a file is one record's alone.

It refuses (409) what retention would make go wrong:
- a retry, once a stage of the pipeline ended so long ago that its stage may delete its job or files
  (CASTAD_RETENTION_ARTIFACTS_S after it ended, the jobs no sooner) before the retried run's deadline:
  a stage applies a pipeline's operator requests in the order its job row records, and the stages
  that succeeded are not run again, their artifacts are used;
- the replay of a dead letter older than CASTAD_RETENTION_INBOX_S: its consumer may have forgotten
  that it handled the event, and would take it for a new one.
Both with MARGIN_S to spare, for the clocks of different databases and the time requests spend in queues.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from castad_runtime import artifacts, settings
from castad_runtime import retention as runtime_retention

from castad_api import brands, dead_letters, keys, repository, timeline_rows, upload_limits, uploaded

MARGIN_S = 3600.0
PIPELINE_ROWS = 14  # a pipeline, its stages and their attempts, its notices and their tries, about
LETTER_ROWS = 3  # a dead letter and its actions, about
KEY_WINDOW_KEPT_S = 120.0  # a key's creation count is read only during its own minute
IMAGE_FILES = 10  # an image costs a deletion in the store: far fewer of them per batch
IMAGES_AT_ONCE = 10  # the rows of images whose files are gone are deleted this many at a time


@dataclasses.dataclass(frozen=True)
class Policy:
    """How long the gateway keeps what it keeps, and what it must know of the stages' retention."""

    inbox_s: float
    artifacts_s: float
    timeline_s: float
    pipelines_s: float
    dead_letters_s: float
    dead_letters_left_s: float  # a dead letter nobody dealt with, after it came
    deadline_s: float  # a pipeline's run after its request or retry
    images_s: float  # an uploaded image no pipeline names, after its last upload

    def artifacts_gone(self, finished_at: dt.datetime, now: dt.datetime) -> bool:
        """Whether the files of a stage that ended at `finished_at` are deleted (or due to be) by `now`."""
        return now >= finished_at + dt.timedelta(seconds=self.artifacts_s)

    def retry_refusal(self, finished: Mapping[str, dt.datetime], now: dt.datetime) -> str | None:
        """Why a pipeline whose stages ended at `finished` (stage -> when) cannot be retried `now`; None if it can."""
        if not finished:
            return None
        stage, at = min(finished.items(), key=lambda item: item[1])
        last_chance = at + dt.timedelta(seconds=self.artifacts_s - self.deadline_s - MARGIN_S)
        if now < last_chance:
            return None
        return (
            f"its {stage} stage ended at {_utc(at)}: the stages delete a finished job and its files"
            f" {_duration(self.artifacts_s)} after it ended (CASTAD_RETENTION_ARTIFACTS_S), and a retried run may take"
            f" {_duration(self.deadline_s)} (CASTAD_API_PIPELINE_DEADLINE_S); retries ended at {_utc(last_chance)}"
        )

    def replay_refusal(self, since: dt.datetime, now: dt.datetime) -> str | None:
        """Why a dead letter of an event from `since` cannot be replayed `now`; None if it can."""
        last_chance = since + dt.timedelta(seconds=self.inbox_s - MARGIN_S)
        if now < last_chance:
            return None
        return (
            f"its event is from {_utc(since)}: consumers forget the events they handled {_duration(self.inbox_s)}"
            f" later (CASTAD_RETENTION_INBOX_S) and would take it for a new one; replays ended at {_utc(last_chance)}"
        )


def _utc(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def steps(
    engine: sa.Engine,
    config: settings.CommonSettings,
    policy: Policy,
    store: artifacts.ArtifactStore,
    limits: upload_limits.Limits,
) -> list[runtime_retention.Step]:
    """The gateway's retention.

    Outbox, inbox, timelines, pipelines, dead letters, creation counts, upload buckets and uploaded images (after
    the pipelines: an image is kept while one names it).
    """
    step = runtime_retention.statement_step
    return [
        *runtime_retention.shared_steps(engine, config),
        step(
            "timeline entries", engine, lambda conn, limit: timeline_rows.forget_ended(conn, policy.timeline_s, limit)
        ),
        step(
            "pipelines",
            engine,
            lambda conn, limit: repository.forget_ended(conn, policy.pipelines_s, limit),
            rows_each=PIPELINE_ROWS,
        ),
        step(
            "dead letters",
            engine,
            lambda conn, limit: dead_letters.forget_settled(conn, policy.dead_letters_s, limit),
            rows_each=LETTER_ROWS,
        ),
        step(
            "dead letters nobody dealt with",
            engine,
            lambda conn, limit: dead_letters.forget_left(conn, policy.dead_letters_left_s, limit),
            rows_each=LETTER_ROWS,
        ),
        step("creation counts", engine, lambda conn, limit: keys.forget_windows(conn, KEY_WINDOW_KEPT_S, limit)),
        step(
            "upload buckets",
            engine,
            lambda conn, limit: upload_limits.forget_buckets(conn, limits.full_after_s(), limit),
        ),
        runtime_retention.Step(
            "uploaded images",
            lambda limit: forget_images(engine, store, policy.images_s, limit),
            rows_each=IMAGE_FILES,
        ),
    ]


def forget_images(engine: sa.Engine, store: artifacts.ArtifactStore, older_than_s: float, limit: int) -> int:
    """Deal with up to `limit` images last uploaded, or last found named, more than `older_than_s` ago.

    Choose those no pipeline names, in a transaction (each is found no more from its commit on), then delete each
    one's file outside any transaction, and the records of those whose file is gone, IMAGES_AT_ONCE at a time; find
    the others named again, which moves them as far off as an upload would (each is looked at once a period, not on
    every round). How many it dealt with. A store that fails stops the batch: the images deleted before are recorded
    deleted, the others are found again (the next round chooses them again), then its error is raised.
    """
    with runtime_retention.transaction(engine) as conn:
        locked = uploaded.lock_expired(conn, older_than_s, limit)
        if not locked:
            return 0
        # Named or not, asked now that they are locked: this statement's snapshot sees every pipeline committed
        # before the locks were taken.
        kept = named_among(conn, locked)
        if kept:
            uploaded.found_named(conn, kept)
        doomed = [row for row in uploaded.get_images(conn, locked) if row.id not in kept]
        if doomed:
            uploaded.choose_to_delete(conn, [row.id for row in doomed])
    gone: list[uuid.UUID] = []  # files deleted; the last of them, from `recorded` on, with their rows still there
    recorded = 0
    try:
        for row in doomed:
            store.delete_image(uploaded.photo(row))
            gone.append(row.id)
            if len(gone) - recorded == IMAGES_AT_ONCE or len(gone) == len(doomed):
                _forget_deleted(engine, gone[recorded:])
                recorded = len(gone)
    except BaseException:
        with runtime_retention.transaction(engine) as conn:
            uploaded.unchoose(conn, [row.id for row in doomed[len(gone) :]])
        _forget_deleted(engine, gone[recorded:])
        raise
    return len(kept) + len(gone)


def _forget_deleted(engine: sa.Engine, image_ids: list[uuid.UUID]) -> None:
    """Delete the records of images whose files are gone."""
    with runtime_retention.transaction(engine) as conn:
        uploaded.forget_deleted(conn, image_ids)


def named_among(conn: sa.Connection, image_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Those of the images a pipeline's brief names, as a photo or as its brand's logo, or a brand kit shows."""
    return repository.naming_images(conn, image_ids) | brands.showing(conn, image_ids)
