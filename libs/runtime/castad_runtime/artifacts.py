"""Artifacts on disk, referenced by file URI, sha256 and size."""

from __future__ import annotations

import hashlib
import os
import pathlib
import urllib.parse

from castad_contracts import events


class ArtifactStore:
    """Files under `root/<pipeline id>/<stage><suffix>`; an attempt writes a private temp file first."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root.resolve()

    def scratch_path(self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str) -> pathlib.Path:
        directory = self.root / pipeline_id
        directory.mkdir(parents=True, exist_ok=True)
        return directory / f".{stage.value}.attempt{attempt}{suffix}"

    def keep(self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str) -> events.Artifact:
        """Move an attempt's file to its final name and describe it."""
        final = self.root / pipeline_id / f"{stage.value}{scratch.suffix}"
        digest = _sha256(scratch)
        size = scratch.stat().st_size
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
