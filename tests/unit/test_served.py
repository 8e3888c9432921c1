"""A stored file is served only as its record describes it (castad_api.served)."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import pathlib

import pytest
from castad_api import served
from castad_runtime import artifacts

BYTES = b"a finished song, as its event recorded it"


def recorded(data: bytes = BYTES) -> served.Recorded:
    return served.Recorded(hashlib.sha256(data).hexdigest(), len(data))


def body_of(response) -> list[bytes]:  # noqa: ANN001
    async def read() -> list[bytes]:
        return [chunk async for chunk in response.body_iterator]

    return asyncio.run(read())


def test_a_file_as_recorded_is_sent_whole_as_an_attachment_and_checked_once_while_unchanged(tmp_path):
    path = tmp_path / "song-abc.mp3"
    path.write_bytes(BYTES)
    seals, told = served.Seals(), []

    first = served.file(path, recorded(), "audio/mpeg", "p-song", seals, told.append)
    assert b"".join(body_of(first)) == BYTES
    second = served.file(path, recorded(), "text/html", "p-song", seals, told.append)

    assert b"".join(body_of(second)) == BYTES and told == []
    assert first.headers["content-disposition"] == 'attachment; filename="p-song.mp3"'
    assert second.media_type == "application/octet-stream"  # never a type a browser runs as a page
    assert len(seals._seen) == 1


@pytest.mark.parametrize("change", ["other-bytes", "other-size", "a-link", "a-directory", "a-named-pipe"])
def test_a_file_not_as_recorded_is_refused_before_a_byte_is_sent(tmp_path, change):
    path = tmp_path / "song-abc.mp3"
    genuine = tmp_path / "genuine.mp3"
    genuine.write_bytes(BYTES)
    if change == "other-bytes":
        path.write_bytes(BYTES.replace(b"finished", b"forged!!"))
    elif change == "other-size":
        path.write_bytes(BYTES + b"!")
    elif change == "a-link":
        path.symlink_to(genuine)  # its bytes are the recorded ones, but it is not the file itself
    elif change == "a-directory":
        path.mkdir()
    else:
        os.mkfifo(path)  # opened without waiting for a writer: it would hold the gateway's thread
    told: list[served.Corrupt] = []

    with pytest.raises(served.Corrupt):
        served.file(path, recorded(), "audio/mpeg", "p-song", served.Seals(), told.append)

    assert len(told) == 1


def test_a_file_gone_since_its_record_was_read_is_missing_not_corrupt(tmp_path):
    told: list[served.Corrupt] = []

    with pytest.raises(artifacts.ArtifactMissing):
        served.file(tmp_path / "gone.mp3", recorded(), "audio/mpeg", "p-song", served.Seals(), told.append)

    assert told == []


@pytest.mark.parametrize("change", ["rewritten", "grown"])
def test_a_file_changed_in_place_while_it_is_sent_ends_the_answer_before_its_last_chunk(tmp_path, monkeypatch, change):
    monkeypatch.setattr(served, "CHUNK_BYTES", 8)
    path = tmp_path / "song-abc.mp3"
    path.write_bytes(BYTES)
    told: list[served.Corrupt] = []
    response = served.file(path, recorded(), "audio/mpeg", "p-song", served.Seals(), told.append)

    if change == "rewritten":  # checked, then changed before it is sent
        path.write_bytes(BYTES.replace(b"recorded", b"REWRITES"))
    else:  # the recorded bytes, and more after them
        with path.open("ab") as more:
            more.write(b" and a forged coda")
    sent: list[bytes] = []

    async def read() -> None:
        async for chunk in response.body_iterator:
            sent.append(chunk)

    with pytest.raises(served.Corrupt, match="changed while it was sent"):
        asyncio.run(read())
    assert len(b"".join(sent)) < len(BYTES) and len(told) == 1


def test_a_presigned_url_is_answered_by_a_temporary_redirect_with_nothing_read_here():
    url = "https://bucket.example/video?X-Amz-Signature=s"

    remote = served.file(url, recorded(), "video/mp4", "pipeline-video", served.Seals(), [].append)

    assert (remote.status_code, remote.headers["location"]) == (307, url)


def test_an_answer_dropped_before_its_first_byte_leaves_no_file_open(tmp_path):
    """A client may go before the body is sent: the file the check opened is closed all the same."""
    path = tmp_path / "song-abc.mp3"
    path.write_bytes(BYTES)

    def open_files() -> int:
        return len(list(pathlib.Path("/proc/self/fd").iterdir()))

    before = open_files()
    response = served.file(path, recorded(), "audio/mpeg", "p-song", served.Seals(), [].append)
    assert open_files() == before + 1
    del response
    gc.collect()

    assert open_files() == before
