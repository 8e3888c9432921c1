"""Artifacts on disk, referenced by file URI, sha256 and size."""

from __future__ import annotations

import hashlib
import os
import pathlib
import urllib.parse

from castad_contracts import events

DIGEST_NAME_CHARS = 16  # hex characters of the sha256 in a final name: 64 bits


class ArtifactStore:
    """Files under `root/<pipeline id>/<stage>-<sha256 prefix><suffix>`, content-addressed.

    An attempt writes its own scratch file, then `keep` moves it to a name derived from its
    bytes. A timed-out attempt may still finish after a newer one has published its artifact;
    with content-addressed names its late `keep` either replaces a file with the same bytes or
    writes a different file, so the sha256 and size in an event always describe the file at
    its URI. A pipeline's directory may therefore hold more than one file of a stage; only the
    one named in the stage's completed event is its artifact.
    """

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root.resolve()

    def scratch_path(self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str) -> pathlib.Path:
        directory = self.root / pipeline_id
        directory.mkdir(parents=True, exist_ok=True)
        return directory / f".{stage.value}.attempt{attempt}{suffix}"

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
