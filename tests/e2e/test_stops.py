"""A service stopped mid-attempt finishes its attempt or hands it back, never fails it.

It is stopped by SIGTERM to its whole process group, as Kubernetes, systemd, honcho and Ctrl-C send it; its attempt
finishes within the grace period or is handed back. With CASTAD_VIDEO_MAX_ATTEMPTS=1 a single counted failure would
end the pipeline.
"""

from __future__ import annotations

import pathlib
import signal
import time

import pytest
from castad_testkit import briefs

pytestmark = pytest.mark.e2e

# Frames and a song big enough that ffmpeg encodes for a second or two (caught mid-render: the test fails if not),
# small enough not to spend more.
SLOW_RENDER = {"CASTAD_VIDEO_MAX_ATTEMPTS": "1", "CASTAD_VIDEO_SHORT_SIDE": "360", "CASTAD_VIDEO_FPS": "12"}


def ffmpeg_of(pipeline_id: str) -> list[int]:
    """Pids of running ffmpeg processes writing this pipeline's video."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command and b"ffmpeg" in command[0] and any(pipeline_id.encode() in part for part in command):
            found.append(int(proc.name))
    return found


def stop_mid_render(running, pipeline_id: str) -> float:
    """SIGTERM the video service's process group once its ffmpeg runs; wait for the service to exit."""
    pids = running.wait_until("ffmpeg rendering the video", lambda: ffmpeg_of(pipeline_id), timeout_s=120)
    process = running.services.processes["video"]
    started = time.monotonic()
    running.services.signal("video", signal.SIGTERM)
    process.wait(60)
    running.services.processes.pop("video")
    assert pids
    return time.monotonic() - started


@pytest.mark.timeout(240)
def test_a_render_still_running_when_its_service_is_stopped_finishes_within_the_grace_period(castad, dbs):
    running = castad({**SLOW_RENDER, "CASTAD_VIDEO_STOP_GRACE_S": "60"})
    pipeline_id = running.submit(briefs.sample(duration_s=30))

    stop_mid_render(running, pipeline_id)

    (job,) = dbs.jobs_of("video", [pipeline_id])
    assert (job["status"], job["attempts"]) == ("SUCCEEDED", 1)
    running.services.start("video")
    view = running.wait_terminal([pipeline_id])[pipeline_id]
    assert view.status == "SUCCEEDED"


@pytest.mark.timeout(240)
def test_a_render_outlasting_the_grace_period_is_handed_back_uncounted_and_done_after_the_restart(castad, dbs):
    running = castad({**SLOW_RENDER, "CASTAD_VIDEO_STOP_GRACE_S": "0.2"})
    pipeline_id = running.submit(briefs.sample(duration_s=30))

    stopped_in = stop_mid_render(running, pipeline_id)

    assert stopped_in < 20
    assert ffmpeg_of(pipeline_id) == []  # killed with its attempt, not left behind
    (job,) = dbs.jobs_of("video", [pipeline_id])
    assert (job["status"], job["attempts"], job["counted_attempts"]) == ("RETRY_WAIT", 1, 0)
    (attempt,) = dbs.attempts_of("video", job["id"])
    assert (attempt["outcome"], attempt["error_code"]) == ("interrupted", "worker_stopped")
    assert not list((running.installation.artifacts_dir / "video" / pipeline_id).glob(".video.*"))  # no scratch left

    running.services.start("video", {"CASTAD_VIDEO_SHORT_SIDE": "144", "CASTAD_VIDEO_FPS": "4"})
    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert view.status == "SUCCEEDED"
    video = next(stage for stage in view.stages if stage.stage.value == "video")
    assert (video.status, video.attempts) == ("SUCCEEDED", 2)
    (job,) = dbs.jobs_of("video", [pipeline_id])
    assert (job["attempts"], job["counted_attempts"]) == (2, 1)
