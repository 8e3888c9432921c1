"""A file of the artifact store as an answer: its bytes as their record describes them, or a redirect.

Every stage mounts the volume the gateway serves from, so a compromised one could change another pipeline's (another
tenant's) file, or put a link at its name. The gateway serves a local file only as its record describes it:
- opened without following a link at its name and without waiting (a named pipe put there would hold the thread),
  a regular file of the recorded size, whose sha256 is the recorded one, checked before the first byte is sent
  (`Seals` remembers a file checked and unchanged since, by its inode, size and change times, so that a file served
  again is not read twice);
- and checked again as it is sent, no byte past the recorded size, the last chunk held back until the whole digest
  is known: a file changed in place while it is sent ends the answer before its end, never as a complete 200.

(`VolumeStore.serve` already refused a link out of the pipeline's and stage's place: 404.) A mismatch is `Corrupt`:
the caller gets 500 with a clear reason and none of the bytes, the operators a log line and
castad_api_integrity_failures_total. A file gone since its record was read is `artifacts.ArtifactMissing` (404); any
other failure to open it is the store's outage (`outages.StoreUnavailable`, 503). Either way a file is an attachment
of an allowed media type (`artifacts.served_media_type`: never one a browser runs as a page); with an object store,
the answer is a redirect to a presigned URL that says so (`artifacts.s3.S3Store.serve`), and the object store's bytes
are not checked here.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import hashlib
import logging
import os
import pathlib
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from castad_runtime import artifacts, outages, redact
from fastapi import status
from fastapi.responses import RedirectResponse, Response, StreamingResponse

log = logging.getLogger(__name__)
CHUNK_BYTES = 256 * 1024
SEALS_KEPT = 10_000


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What a stored file must be: as the event that announced it (or the upload's record) says."""

    sha256: str
    size: int


class Corrupt(Exception):
    """A stored file that is not what its record says (other bytes, another size, a link, no regular file)."""


class Seals:
    """Files whose bytes were checked, each by its identity then: a file unchanged since is not read again."""

    def __init__(self, kept: int = SEALS_KEPT) -> None:
        self.kept = kept
        self._seen: collections.OrderedDict[tuple[object, ...], None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, identity: tuple[object, ...]) -> bool:
        with self._lock:
            return identity in self._seen

    def add(self, identity: tuple[object, ...]) -> None:
        with self._lock:
            self._seen[identity] = None
            self._seen.move_to_end(identity)
            while len(self._seen) > self.kept:
                self._seen.popitem(last=False)


def file(
    where: pathlib.Path | str,
    recorded: Recorded,
    media_type: str,
    name: str,
    seals: Seals,
    on_corrupt: Callable[[Corrupt], None],
) -> Response:
    """Answer with a stored file as `recorded`, or with a 307 to its presigned URL.

    `where` is a local path, offered as `name` and its suffix, or a presigned URL, as the store's `serve` or
    `serve_image` gave it. Raises Corrupt (after `on_corrupt`) for a local file that is not as recorded.
    """
    if isinstance(where, str):
        return RedirectResponse(where, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    try:
        opened = os.fdopen(_opened(where, recorded, seals), "rb", buffering=0)
    except Corrupt as corrupt:
        on_corrupt(corrupt)
        raise
    headers = {
        "Content-Length": str(recorded.size),
        "Content-Disposition": artifacts.attachment(f"{name}{where.suffix}"),
        "ETag": f'"{recorded.sha256}"',
        "X-Content-Type-Options": "nosniff",
    }
    body = _Sending(opened, where, recorded, on_corrupt)
    return _FileAnswer(body, artifacts.served_media_type(media_type), headers)


def _opened(path: pathlib.Path, recorded: Recorded, seals: Seals) -> int:
    """The file at `path` opened, as recorded; raises Corrupt, artifacts.ArtifactMissing or StoreUnavailable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise artifacts.ArtifactMissing(f"no file at {path}") from None
    except OSError as error:
        if error.errno == errno.ELOOP:  # a link at its name
            raise Corrupt(f"{path} is a link, not the file on record") from None
        raise outages.StoreUnavailable(f"open {path}: {redact.describe(error)}") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_size != recorded.size:
            raise Corrupt(f"{path} is no regular file of the {recorded.size} bytes on record")
        identity = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns, recorded.sha256)
        if identity not in seals:
            digest = hashlib.sha256()
            for chunk in _chunks(fd, recorded.size):
                digest.update(chunk)
            if digest.hexdigest() != recorded.sha256 or _grew(fd, recorded.size):
                raise Corrupt(f"{path} does not have the bytes on record (sha256 {recorded.sha256})")
            seals.add(identity)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _chunks(fd: int, size: int) -> Iterator[bytes]:
    """The file's first `size` bytes (fewer if it is shorter), in chunks."""
    offset = 0
    while offset < size and (chunk := os.pread(fd, min(CHUNK_BYTES, size - offset), offset)):
        offset += len(chunk)
        yield chunk


def _grew(fd: int, size: int) -> bool:
    return bool(os.pread(fd, 1, size))


class _Sending:
    """The file's chunks, each sent once the next is read, the last once the whole digest is the recorded one."""

    def __init__(
        self, opened: BinaryIO, path: pathlib.Path, recorded: Recorded, on_corrupt: Callable[[Corrupt], None]
    ) -> None:
        self.opened, self.path, self.recorded, self.on_corrupt = opened, path, recorded, on_corrupt

    def __iter__(self) -> Iterator[bytes]:
        with self.opened:
            digest, size, held = hashlib.sha256(), 0, b""
            for chunk in _chunks(self.opened.fileno(), self.recorded.size):
                digest.update(chunk)
                size += len(chunk)
                if held:
                    yield held
                held = chunk
            if (
                digest.hexdigest() != self.recorded.sha256
                or size != self.recorded.size
                or _grew(self.opened.fileno(), size)
            ):
                corrupt = Corrupt(f"{self.path} changed while it was sent: the answer ends unfinished")
                self.on_corrupt(corrupt)
                raise corrupt
            yield held

    def close(self) -> None:
        self.opened.close()


class _FileAnswer(StreamingResponse):
    """A stored file's answer, which closes the file however it ends: sent, cut short, or never begun."""

    def __init__(self, body: _Sending, media_type: str, headers: dict[str, str]) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self._sending = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._sending.close()

    def __del__(self) -> None:
        self._sending.close()  # an answer dropped without being sent
