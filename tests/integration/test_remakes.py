"""A remake's stage before the one made again: its output of the remade pipeline copied, its provider never asked.

The lyric stage's runner on a real PostgreSQL and a volume store, its work counting the calls it gets.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import envelope, events
from castad_runtime import artifacts, db, tables
from castad_runtime.artifacts import volume
from castad_runtime.stage import cancellation, outcomes, remakes, repository, runner

from tests.integration.helpers import output, pipeline_requested, stage_runner

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


def writer(store: artifacts.ArtifactStore, calls: list[str]) -> runner.Work:
    """The lyric stage's work as a provider: each call counted, its file kept in the store."""

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        calls.append(job.pipeline_id)
        lyrics = output().details["lyrics"]
        with store.scratch(job.pipeline_id, events.Stage.LYRIC, job.attempts, ".txt") as scratch:
            scratch.write_text(lyrics.text(), encoding="utf-8")
            kept = store.keep(scratch, job.pipeline_id, events.Stage.LYRIC, "text/plain; charset=utf-8")
        return outcomes.Output(kept, {"lyrics": lyrics})

    return work


def run(stage: runner.StageRunner, request: events.PipelineRequested) -> None:
    with db.transaction(stage.engine) as conn:
        assert stage.accept(conn, request)
    claim = stage.claim_next()
    assert claim is not None
    stage.execute(claim)


def told(engine: sa.Engine, pipeline_id: str) -> dict[str, Any]:
    o = tables.outbox
    with engine.connect() as conn:
        rows = conn.execute(sa.select(o.c.routing_key, o.c.envelope).where(o.c.pipeline_id == pipeline_id))
        return {row.routing_key: row.envelope for row in rows}


def test_a_remake_copies_the_stages_output_and_passes_the_remake_on_without_a_call(engine, tmp_path: pathlib.Path):
    store, calls = volume.VolumeStore(tmp_path), []
    work = remakes.reusing(events.Stage.LYRIC, engine, store, writer(store, calls), events.PipelineRequested)
    stage = stage_runner(engine, work)
    source = pipeline_requested()
    run(stage, source)
    remade = pipeline_requested(remake=events.Remake(of=source.pipeline_id, stage=events.Stage.SONG))

    run(stage, remade)

    assert calls == [source.pipeline_id]  # the remake asked nothing
    first_env = envelope.Envelope.model_validate(told(engine, source.pipeline_id)["lyric.completed"])
    first = first_env.payload()
    again_env = envelope.Envelope.model_validate(told(engine, remade.pipeline_id)["lyric.completed"])
    again = again_env.payload()
    assert isinstance(first, events.LyricCompleted) and isinstance(again, events.LyricCompleted)
    assert again_env.schemaversion == 8 and again.remake == remade.remake  # passed on, as the version that has it
    assert first.remake is None and first_env.schemaversion < 8  # a pipeline that is no remake: written as before
    assert (again.lyrics, again.artifact.sha256) == (first.lyrics, first.artifact.sha256)
    assert events.in_stage_place(again.artifact.uri, remade.pipeline_id, events.Stage.LYRIC)
    with store.local_copy(again.artifact, remade.pipeline_id, events.Stage.LYRIC) as copied:
        assert copied.read_text(encoding="utf-8") == first.lyrics.text()


def test_a_remake_whose_source_is_gone_fails_for_good_naming_why(engine, tmp_path: pathlib.Path):
    store, calls = volume.VolumeStore(tmp_path), []
    work = remakes.reusing(events.Stage.LYRIC, engine, store, writer(store, calls), events.PipelineRequested)
    stage = stage_runner(engine, work)
    kept = pipeline_requested()
    run(stage, kept)
    store.delete(kept.pipeline_id, events.Stage.LYRIC)  # as retention deletes its files
    nowhere = pipeline_requested(remake=events.Remake(of=pipeline_requested().pipeline_id, stage=events.Stage.VIDEO))
    no_file = pipeline_requested(remake=events.Remake(of=kept.pipeline_id, stage=events.Stage.SONG))

    for remade in (nowhere, no_file):
        run(stage, remade)

        failed = told(engine, remade.pipeline_id)["lyric.failed"]["data"]
        assert failed["error_code"] == "remake_source_gone" and failed["attempt"] == 1, failed
    assert calls == [kept.pipeline_id]
