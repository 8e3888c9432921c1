"""Which version of an event each consuming service reads, as the relay judges it before it publishes."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from castad_contracts import events, topology
from castad_relay import readers
from castad_runtime import db
from castad_runtime.stage import handlers

REQUESTED = events.PIPELINE_REQUESTED  # the lyric stage's trigger: only the lyric stage's queue takes it
LIVE, GONE = True, False


def judged(words: dict[str, list[dict[str, Any]] | None], event_type: str, version: int) -> readers.Unread | None:
    """`Readers.unread` with each service's word as given (None: no word from it)."""
    judge = readers.Readers({service: "postgresql://unused/db" for service in words}, db.SessionLimits(10.0, 5.0))

    async def word(service: str) -> list[dict[str, Any]] | None:
        return words.get(service)

    judge._word = word  # type: ignore[method-assign]
    return asyncio.run(judge.unread(event_type, version))


def replica(live: bool, **reads: int) -> dict[str, Any]:
    return {"live": live, "reads": {REQUESTED if name == "requested" else name: v for name, v in reads.items()}}


def test_an_event_goes_out_when_a_live_replica_reads_its_version_though_another_does_not():
    word = [replica(LIVE, requested=3), replica(LIVE, requested=4)]
    assert judged({"lyric": word}, REQUESTED, 4) is None
    assert judged({"lyric": word}, REQUESTED, 1) is None


def test_an_event_waits_while_every_live_replica_reads_an_older_version_only():
    word = [replica(LIVE, requested=3), replica(GONE, requested=4), replica(LIVE, requested=2)]

    unread = judged({"lyric": word}, REQUESTED, 4)

    assert unread == readers.Unread("lyric", REQUESTED, 4, 3)
    assert unread.reason() == (
        "waits for a replica of lyric that reads pipeline.requested version 4 (they read up to version 3);"
        " it goes out once one runs"
    )


def test_an_event_of_a_type_a_live_replica_does_not_take_waits_until_no_such_replica_runs():
    """A type the service newly takes: a replica of the release before has no handler and would dead-letter it."""
    newly = [replica(LIVE, requested=4), replica(LIVE, other=1)]

    unread = judged({"lyric": newly}, REQUESTED, 4)

    assert unread == readers.Unread("lyric", REQUESTED, 4, 4, untaken=True)
    assert unread.reason() == (
        "waits until no replica of lyric that does not take pipeline.requested runs (it would dead-letter it); it"
        " goes out once they are replaced"
    )
    assert judged({"lyric": [replica(LIVE, requested=4), replica(GONE, other=1)]}, REQUESTED, 4) is None


def test_with_no_live_replica_the_one_seen_last_decides():
    assert judged({"lyric": [replica(GONE, requested=4), replica(GONE, requested=3)]}, REQUESTED, 4) is None
    assert judged({"lyric": [replica(GONE, requested=3), replica(GONE, requested=4)]}, REQUESTED, 4) is not None


def test_a_replica_that_does_not_take_the_type_yet_holds_it():
    unread = judged({"lyric": [replica(LIVE, other=1)]}, REQUESTED, 1)

    assert unread is not None and unread.newest == 0
    assert "(they do not take it)" in unread.reason()


@pytest.mark.parametrize("word", [None, []], ids=["no database or no table", "no replica ever said"])
def test_without_a_word_from_the_service_the_event_goes_out_as_before(word):
    assert judged({"lyric": word}, REQUESTED, 9) is None


def test_every_service_that_takes_the_type_must_read_it():
    completed = events.stage_event(events.Stage.LYRIC, "completed")  # the gateway's queue and the song stage's
    assert set(topology.subscribers(completed)) == {"api", "song"}
    words = {"api": [replica(LIVE, **{completed: 2})], "song": [replica(LIVE, **{completed: 1})]}

    assert judged(words, completed, 1) is None
    assert judged(words, completed, 2) == readers.Unread("song", completed, 2, 1)


@pytest.mark.parametrize("stage", list(events.Stage))
def test_each_stage_handles_every_type_its_queue_takes_so_its_word_holds_none_for_ever(stage):
    """A type routed to a queue whose consumer does not handle it would wait in its outbox for good."""
    fake = types.SimpleNamespace(runner=types.SimpleNamespace(stage=stage))
    for name in ("on_trigger", "on_called_back", "on_cancel", "on_retry", "on_republish", "on_review_decided"):
        setattr(fake, name, name)
    fake.drafts = object() if stage in events.DRAFTED else None

    table = handlers.StageHandlers.table(fake, events.TRIGGERS[stage])  # type: ignore[arg-type]

    assert set(table) == topology.routed(stage.value)
