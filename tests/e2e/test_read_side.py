"""The operator's view, every service its own process.

A pipeline run by the real stages read back as its timeline (each attempt with the worker that ran it and its
duration, the trace it belongs to), followed on the stream of every pipeline, counted by /v1/stats, and shown by
`castad timeline` and `castad stats`, its song's caption file saved by `castad download --captions`, each of the
three formats it asked for and their posters by `castad download --format`.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import httpx_sse
import numpy as np
import pytest
from castad_contracts import api, brief, topology
from castad_testkit import briefs
from PIL import Image, ImageDraw

from tests.e2e.test_cli import cli, one_line_error
from tests.unit.test_video_provider import probe, two_photos

pytestmark = pytest.mark.e2e
JAEGER = "http://127.0.0.1:16686/trace/{trace_id}"
FIREHOSE_S = 20  # the gateway closes each stream of every pipeline after this (tests/integration/test_streams.py)


def follow(running, received: list, opened: threading.Event, last: Callable[[dict], bool], **params: str) -> None:
    """Every entry /v1/events sends, up to the `last` one, resumed after the last id seen as EventSource resumes.

    The gateway closes each stream after FIREHOSE_S, which a pipeline slowed by a busy machine may outlast. The
    first stream starts from the installation's first entry (it is the test's own), so no entry written while a
    stream is opened again is missed; the follower ends with the gateway, if the test ended first.
    """
    headers = {"Last-Event-ID": "0"}
    until = time.monotonic() + 150  # within the test's own timeout
    while time.monotonic() < until:
        try:
            with httpx_sse.connect_sse(
                running.http,
                "GET",
                "/v1/events",
                params=params,
                headers=headers,
                timeout=httpx.Timeout(10.0, read=15.0),
            ) as source:
                assert source.response.status_code == 200, source.response.read()
                opened.set()
                for sse in source.iter_sse():
                    if sse.data:
                        received.append((sse.id, sse.event, json.loads(sse.data)))
                        headers["Last-Event-ID"] = sse.id
                        if last(received[-1][2]):
                            return
        except (httpx.TimeoutException, httpx.RemoteProtocolError):
            continue  # opened again, after the last id seen
        except httpx.ConnectError:
            if not opened.is_set():
                raise
            return  # the gateway is gone: the test is over


MAGENTA = np.array([230, 0, 200])


def magenta_disc() -> bytes:
    """A logo as a business uploads one: a magenta disc on a transparent ground (PNG)."""
    logo = Image.new("RGBA", (120, 120), (0, 0, 0, 0))
    ImageDraw.Draw(logo).ellipse((10, 10, 110, 110), fill=(*MAGENTA.tolist(), 255))
    out = io.BytesIO()
    logo.save(out, "PNG")
    return out.getvalue()


def trace_id_of(traceparent: str) -> str:
    return traceparent.split("-")[1]


@pytest.mark.timeout(180)
def test_a_pipeline_run_by_the_stages_is_told_by_its_timeline_the_firehose_the_numbers_and_the_cli(
    castad, dbs, monkeypatch, tmp_path
):
    monkeypatch.setenv("COLUMNS", "200")  # the command's tables as a wide terminal shows them, one line per row
    running = castad({"CASTAD_API_TRACE_URL": JAEGER, "CASTAD_API_FIREHOSE_MAX_S": str(FIREHOSE_S)})
    streams = {"every": [], "video": []}
    pipeline_id = ""  # known once submitted, which the streams are opened before
    ends = {
        "every": lambda entry: entry["pipeline_id"] == pipeline_id and entry["pipeline_status"] == "SUCCEEDED",
        "video": lambda entry: entry["pipeline_id"] == pipeline_id and entry["status"] == "completed",
    }
    followers = []
    for name, params in (("every", {}), ("video", {"stage": "video"})):
        opened = threading.Event()
        follower = threading.Thread(
            target=follow, args=(running, streams[name], opened, ends[name]), kwargs=params, daemon=True
        )
        followers.append(follower)
        follower.start()
        assert opened.wait(10), f"the {name} stream did not open"

    # The tenant's brand kit, with a logo of its own: the pipeline's every format shows it.
    logo = running.client.upload_image("logo.png", magenta_disc())
    running.client.set_brand(api.BrandKitRequest(logo=logo.id, colors=["#1e90ff", "#ffd700"]))
    shown = [running.client.upload_image(path.name, path.read_bytes()).id for path in two_photos(tmp_path)]
    asked = briefs.sample("바다책방", formats=tuple(brief.Format)).model_dump(mode="json")
    pipeline_id = running.client.submit(api.PipelineRequest(**asked, photos=shown)).id
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"

    answer = running.http.get(f"/v1/pipelines/{pipeline_id}/timeline")
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    # One trace: the one its request began, carried by every event of every stage.
    assert re.fullmatch(r"[0-9a-f]{32}", shown["trace_id"] or ""), shown["trace_id"]
    assert shown["trace_url"] == JAEGER.format(trace_id=shown["trace_id"])
    for service in topology.STAGES:
        for row in dbs.outbox_of(service, pipeline_id):
            assert trace_id_of(row["envelope"]["traceparent"]) == shown["trace_id"], row["routing_key"]

    # Each attempt as the stage that ran it recorded it: its worker, and its duration.
    assert [(a["stage"], a["outcome"]) for a in shown["attempts"]] == [(s, "succeeded") for s in topology.STAGES]
    for attempt in shown["attempts"]:
        service = attempt["stage"]
        [job] = dbs.jobs_of(service, [pipeline_id])
        [recorded] = dbs.attempts_of(service, job["id"])
        assert attempt["worker"] == recorded["worker"] and attempt["worker"].startswith(f"{service}@")
        took = (recorded["finished_at"] - recorded["started_at"]).total_seconds()
        assert 0 < attempt["duration_s"] == pytest.approx(took, abs=0.5), (service, attempt, took)
    entries = shown["entries"]
    assert entries[0]["status"] == "requested" and entries[-1]["pipeline_status"] == "SUCCEEDED"
    assert [dt.datetime.fromisoformat(e["time"]) for e in entries] == sorted(
        dt.datetime.fromisoformat(e["time"]) for e in entries
    )

    # The streams of every pipeline saw each entry once, by seq, and the filtered one only video's. The seqs
    # number entries as the gateway applied them, which for two stages' events may differ from when they
    # happened (the order the timeline shows): the next stage may tell of its start first.
    for follower in followers:
        follower.join(FIREHOSE_S + 15)
        assert not follower.is_alive()
    mine = [data for _, _, data in streams["every"] if data["pipeline_id"] == pipeline_id]
    assert [e["seq"] for e in mine] == sorted(e["seq"] for e in entries)
    assert all(e["customer_name"] == "바다책방" and e["region"] == "속초" for e in mine)
    # An entry's seq is its number among its pipeline's entries; an admin's stream ids, its place among all.
    assert sorted(e["seq"] for e in entries) == list(range(1, len(entries) + 1))
    ids = [int(sse_id) for sse_id, _, _ in streams["every"]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    video = [data for _, _, data in streams["video"] if data["pipeline_id"] == pipeline_id]
    assert [e["status"] for e in video] == ["started", "completed"] and {e["step"] for e in video} == {"video"}

    numbers = running.http.get("/v1/stats", params={"window": "15m"}).json()
    assert numbers["pipelines"]["created"] == 1 and numbers["pipelines"]["finished"] == {"SUCCEEDED": 1}
    assert [(s["stage"], s["succeeded"], s["attempts"]) for s in numbers["stages"]] == [
        (stage, 1, 1) for stage in topology.STAGES
    ]

    gateway = running.base_url
    told = cli(gateway, "timeline", pipeline_id)
    assert told.returncode == 0, told.stderr
    for attempt in shown["attempts"]:
        assert attempt["worker"] in told.stdout
    assert "SUCCEEDED" in told.stdout and "succeeded" in told.stdout
    counted = cli(gateway, "stats", "--window", "15m")
    assert counted.returncode == 0 and "in flight: 0" in counted.stdout and "video" in counted.stdout, counted.stderr
    one_line_error(cli(gateway, "stats", "--window", "1w"), 2, "422: query.window: must be a number of seconds")
    one_line_error(cli(gateway, "timeline", str(uuid.uuid4())), 4, "404: no pipeline")
    # The song's sung lines as a caption file, saved by the command line.
    saved = cli(gateway, "download", pipeline_id, "--captions", "vtt", "--output", str(tmp_path / "song.vtt"))
    assert saved.returncode == 0 and "song.vtt" in saved.stdout, saved.stderr
    written = (tmp_path / "song.vtt").read_text()
    assert written.startswith("WEBVTT\n\n1\n00:00:") and written.count(" --> ") >= 4, written
    saved = cli(gateway, "download", pipeline_id, "--poster", "--output", str(tmp_path / "poster.jpg"))
    assert saved.returncode == 0 and (tmp_path / "poster.jpg").read_bytes()[:3] == b"\xff\xd8\xff", saved.stderr
    # Each format from the one song, laid out for its own frame (the harness's short side is 144), with its poster.
    for shape, size in (("9:16", (144, 256)), ("1:1", (144, 144)), ("16:9", (256, 144))):
        video, still = tmp_path / f"{shape.replace(':', 'x')}.mp4", tmp_path / f"{shape.replace(':', 'x')}.jpg"
        saved = cli(gateway, "download", pipeline_id, "--format", shape, "--output", str(video))
        assert saved.returncode == 0, saved.stderr
        found = probe(video)
        assert ((found.width, found.height), found.audio_codec) == (size, "aac") and found.duration_s > 2.5
        saved = cli(gateway, "download", pipeline_id, "--format", shape, "--poster", "--output", str(still))
        assert saved.returncode == 0, saved.stderr
        with Image.open(still) as poster:
            assert (poster.format, poster.size) == ("JPEG", size)
            pixels = np.asarray(poster.convert("RGB"), dtype=np.int16)
        corner = pixels[size[1] * 3 // 4 :, size[0] * 3 // 4 :].reshape(-1, 3)  # where the logo stands, over a photo
        assert (np.abs(corner - MAGENTA).max(axis=1) < 60).mean() > 0.05, shape
    unknown = cli(gateway, "download", pipeline_id, "--format", "4:5")
    assert unknown.returncode == 2 and "'4:5' is not one of" in unknown.stderr, unknown.stderr
