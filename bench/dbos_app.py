"""The durable peer: the same three steps as one DBOS workflow, behind an HTTP front like Castad's gateway.

Run by `bench.dbos_peer` as `python -m bench.dbos_app` in a process of its own. A POST with an
`Idempotency-Key` starts the workflow `castad_pipeline` under that key as its workflow id (DBOS
runs a workflow id once, which is its idempotency), after validating the brief with Castad's own
request model; the three `@DBOS.step()` functions do what Castad's instant providers do in its
stages (the same provider classes and the same artifact store), so the two do the same work.
DBOS checkpoints the workflow and each step's output in PostgreSQL (the database named by
`BENCH_DBOS_DATABASE_URL`); its fastest configuration for this: one process, workflows started
directly (no queue), LISTEN/NOTIFY on, the default pool.
"""

from __future__ import annotations

import os
import pathlib
from typing import Annotated, Any

import uvicorn
from castad_contracts import api, events
from castad_contracts import brief as brief_
from castad_lyric import instant as lyric_instant
from castad_runtime.artifacts import volume
from castad_runtime.stage import cancellation
from castad_song import instant as song_instant
from castad_video import instant as video_instant
from dbos import DBOS, DBOSConfig, SetWorkflowID
from fastapi import FastAPI, Header, status

STORE = volume.VolumeStore(pathlib.Path(os.environ.get("BENCH_DBOS_ARTIFACTS", "var/bench/dbos-artifacts")))
LYRICS = lyric_instant.InstantLyricProvider()
SONGS = song_instant.InstantSongProvider()
VIDEOS = video_instant.InstantVideoProvider()

app = FastAPI()


@DBOS.step()
def write_lyrics(pipeline_id: str, brief: dict[str, Any]) -> dict[str, Any]:
    lyrics = LYRICS.write(brief_.Brief.model_validate(brief), seed=pipeline_id, cancel=cancellation.Cancellation())
    with STORE.scratch(pipeline_id, events.Stage.LYRIC, 1, ".txt") as scratch:
        scratch.write_text(lyrics.text(), encoding="utf-8")
        artifact = STORE.keep(scratch, pipeline_id, events.Stage.LYRIC, "text/plain; charset=utf-8")
    return {"lyrics": lyrics.model_dump(mode="json"), "artifact": artifact.model_dump(mode="json")}


@DBOS.step()
def sing(pipeline_id: str, brief: dict[str, Any], lyrics: dict[str, Any]) -> dict[str, Any]:
    words = events.Lyrics.model_validate(lyrics)
    with STORE.scratch(pipeline_id, events.Stage.SONG, 1, ".wav") as scratch:
        song = SONGS.compose(
            brief_.Brief.model_validate(brief), words, scratch, pipeline_id, cancel=cancellation.Cancellation()
        )
        artifact = STORE.keep(scratch, pipeline_id, events.Stage.SONG, "audio/wav")
    lines = [line.model_dump(mode="json") for line in song.timed_lines]
    return {"artifact": artifact.model_dump(mode="json"), "timed_lines": lines, "duration_s": song.duration_s}


@DBOS.step()
def render(pipeline_id: str, brief: dict[str, Any], lyrics: dict[str, Any], song: dict[str, Any]) -> dict[str, Any]:
    words = events.Lyrics.model_validate(lyrics)
    timed = [events.TimedLine.model_validate(line) for line in song["timed_lines"]]
    with (
        STORE.local_copy(events.Artifact.model_validate(song["artifact"]), pipeline_id, events.Stage.SONG) as song_path,
        STORE.scratch(pipeline_id, events.Stage.VIDEO, 1, ".mp4") as scratch,
    ):
        video = VIDEOS.render(
            brief_.Brief.model_validate(brief), words, timed, song_path, scratch, pipeline_id,
            cancel=cancellation.Cancellation(),
        )  # fmt: skip
        artifact = STORE.keep(scratch, pipeline_id, events.Stage.VIDEO, "video/mp4")
    return {"artifact": artifact.model_dump(mode="json"), "width": video.width, "height": video.height}


@DBOS.workflow()
def castad_pipeline(pipeline_id: str, brief: dict[str, Any]) -> dict[str, Any]:
    written = write_lyrics(pipeline_id, brief)
    song = sing(pipeline_id, brief, written["lyrics"])
    video = render(pipeline_id, brief, written["lyrics"], song)
    return {"lyric": written["artifact"], "song": song["artifact"], "video": video["artifact"]}


@app.post("/v1/pipelines", status_code=status.HTTP_202_ACCEPTED)
def submit(body: api.PipelineRequest, key: Annotated[str, Header(alias="Idempotency-Key")]) -> dict[str, str]:
    with SetWorkflowID(key):
        handle = DBOS.start_workflow(castad_pipeline, key, body.for_stages(()).model_dump(mode="json"))
    return {"id": handle.get_workflow_id()}


@app.get("/v1/pipelines/{pipeline_id}/result")
def result(pipeline_id: str) -> dict[str, Any]:
    """Waits for the workflow's end (as a client following Castad's event stream does)."""
    output: dict[str, Any] = DBOS.retrieve_workflow(pipeline_id).get_result()
    return output


def main() -> None:
    config: DBOSConfig = {
        "name": "castad-bench-peer",
        "system_database_url": os.environ["BENCH_DBOS_DATABASE_URL"],
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["BENCH_DBOS_PORT"]), log_level="warning")


if __name__ == "__main__":
    main()
