"""Artifacts on disk, referenced by file URI, sha256 and size."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import urllib.parse
from collections.abc import Iterator

from castad_contracts import events

DIGEST_NAME_CHARS = 16  # hex characters of the sha256 in a final name: 64 bits


class ArtifactStore:
    """Files under `root/<pipeline id>/<stage>-<sha256 prefix><suffix>`, content-addressed.

    An attempt writes its own scratch file (`scratch`), then `keep` moves it to a name derived
    from its bytes. A timed-out attempt may still finish after a newer one has published its artifact;
    with content-addressed names its late `keep` either replaces a file with the same bytes or
    writes a different file, so the sha256 and size in an event always describe the file at
    its URI. A pipeline's directory may therefore hold more than one file of a stage; only the
    one named in the stage's completed event is its artifact.
    """

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root.resolve()

    @contextlib.contextmanager
    def scratch(self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str) -> Iterator[pathlib.Path]:
        """A file for an attempt to write, removed when the block ends unless `keep` moved it.

        Scratch files of earlier attempts of the stage (left by a worker that was killed, or by
        an attempt abandoned while it was still writing) are removed first.
        """
        directory = self.root / pipeline_id
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob(f".{stage.value}.attempt*"):
            stale.unlink(missing_ok=True)
        path = directory / f".{stage.value}.attempt{attempt}{suffix}"
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def keep(self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str) -> events.Artifact:
        """Move an attempt's file to its content-addressed final name and describe it."""
        digest = _sha256(scratch)
        size = scratch.stat().st_size
        final = self.root / pipeline_id / f"{stage.value}-{digest[:DIGEST_NAME_CHARS]}{scratch.suffix}"
        os.replace(scratch, final)
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=size, media_type=media_type)

    def path(self, artifact: events.Artifact) -> pathlib.Path:
        """The local file of an artifact; raises ValueError if it is not under this store."""
        parsed = urllib.parse.urlparse(artifact.uri)
        if parsed.scheme != "file":
            raise ValueError(f"not a local artifact: {artifact.uri}")
        path = pathlib.Path(urllib.parse.unquote(parsed.path)).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"artifact outside {self.root}: {artifact.uri}")
        return path


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
