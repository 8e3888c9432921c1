"""What a provider's result is, by its first bytes: a CDN's content type is not to be trusted either way.

A file host may serve an MP3 as `application/octet-stream`, or an error page as `audio/mpeg`; the
bytes decide (castad_runtime.stage.http.download), the header is only logged when it disagrees.
"""

from __future__ import annotations

HEAD_BYTES = 16  # enough for every signature below


def media_type(head: bytes) -> str | None:
    """The media type a file's first bytes show, None when they show none of these.

    WAV (`RIFF....WAVE`), MP3 (an ID3v2 tag, or an MPEG audio frame's sync word with a layer), MP4/M4A (an ISO base
    media `ftyp` box first), Ogg, FLAC; and the stills a render API gives with a video: JPEG, PNG.
    """
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio/wav"
    if head[:3] == b"\xff\xd8\xff":  # before MP3's sync word, which a JPEG's first bytes are not, but close to
        return "image/jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if head[:3] == b"ID3":
        return "audio/mpeg"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and (head[1] >> 1) & 0x3 != 0:
        return "audio/mpeg"
    if head[4:8] == b"ftyp":
        return "audio/mp4" if head[8:12] in (b"M4A ", b"M4B ") else "video/mp4"
    if head[:4] == b"OggS":
        return "audio/ogg"
    if head[:4] == b"fLaC":
        return "audio/flac"
    return None
