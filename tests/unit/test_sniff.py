"""A provider's result is known by its first bytes, whatever its server says it is."""

from __future__ import annotations

import pytest
from castad_local.fakes import media
from castad_runtime.stage import sniff


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"RIFF\x24\x08\x00\x00WAVEfmt ", "audio/wav"),
        (b"ID3\x04\x00\x00\x00\x00\x00\x00", "audio/mpeg"),
        (b"\xff\xfb\x90\x64\x00", "audio/mpeg"),  # an MPEG audio frame: layer III
        (b"\x00\x00\x00\x20ftypisom\x00\x00", "video/mp4"),
        (b"\x00\x00\x00\x20ftypM4A \x00\x00", "audio/mp4"),
        (b"OggS\x00\x02", "audio/ogg"),
        (b"fLaC\x00\x00\x00\x22", "audio/flac"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "image/jpeg"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png"),
        (b"<!doctype html><html>", None),
        (b"\xff\xe1\x00", None),  # a sync word without a layer
        (b"", None),
    ],
)
def test_a_file_is_known_by_its_first_bytes(head, kind):
    assert sniff.media_type(head[: sniff.HEAD_BYTES]) == kind


def test_the_fakes_media_are_what_they_are_served_as():
    assert sniff.media_type(media.jpeg()[: sniff.HEAD_BYTES]) == "image/jpeg"
    assert sniff.media_type(media.mp4()[: sniff.HEAD_BYTES]) == "video/mp4"
