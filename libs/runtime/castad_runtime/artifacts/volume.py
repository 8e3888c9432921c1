"""The artifact store on a volume: files under a root directory, each stage writing its own place.

Its names and places are castad_runtime.artifacts.layout's, its protocol and errors castad_runtime.artifacts'; the
store in a bucket is castad_runtime.artifacts.s3.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pathlib
import stat
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

from castad_contracts import brief, events

from castad_runtime import artifacts, outages, redact
from castad_runtime.artifacts import layout


@layout.outside_transactions
class VolumeStore:
    """Files under `root`, a directory of which each stage mounts its own place to write and what it reads."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root.resolve()

    def scratch(
        self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str
    ) -> contextlib.AbstractContextManager[pathlib.Path]:
        return layout.scratch_file(self.root / layout.folder_of(pipeline_id, stage), stage, attempt, suffix)

    def keep(
        self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str, made_as: str | None = None
    ) -> events.Artifact:
        """Move an attempt's file to its content-addressed final name and describe it.

        `made_as`: the part of the stage's work it is, which `made` finds it by."""
        digest = layout.sha256_of(scratch)
        size = scratch.stat().st_size
        final = self.root / layout.final_name(pipeline_id, stage, digest, scratch.suffix, made_as)
        os.replace(scratch, final)
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=size, media_type=media_type)

    def path(self, artifact: events.Artifact) -> pathlib.Path:
        """The local file of an artifact; raises ArtifactMissing if it is not under this store."""
        parsed = urllib.parse.urlparse(artifact.uri)
        if parsed.scheme != "file":
            raise artifacts.ArtifactMissing(f"not a local artifact: {artifact.uri}")
        path = pathlib.Path(urllib.parse.unquote(parsed.path)).resolve()
        if not path.is_relative_to(self.root):
            raise artifacts.ArtifactMissing(f"artifact outside {self.root}: {artifact.uri}")
        return path

    def placed(self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> pathlib.Path:
        """The local file of an artifact of the stage of the pipeline.

        Raises ArtifactMissing if it is not under this store, ArtifactMisplaced if it is not in that stage's place.
        """
        path = self.path(artifact)
        moved = layout.placed(path.relative_to(self.root).as_posix(), artifact, pipeline_id, stage)
        if moved is None or os.path.lexists(path):
            return path
        there = (self.root / moved).resolve()  # a link at the moved name is judged where it leads, as any name
        if not there.is_relative_to(self.root) or layout.placed(
            there.relative_to(self.root).as_posix(), artifact, pipeline_id, stage
        ):
            raise artifacts.ArtifactMisplaced(
                f"{artifact.uri} is not a file of the {stage.value} stage of pipeline {pipeline_id}"
            )
        return there

    @contextlib.contextmanager
    def local_copy(self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> Iterator[pathlib.Path]:
        """A private copy of the artifact's file (off the volume), its bytes checked as they are copied.

        A deployment may give every stage the whole volume, so another could change the file, also after a check:
        the copy is what the event describes, whatever happens to the file since. Removed when the block ends.
        """
        path = self.placed(artifact, pipeline_id, stage)
        descriptor, name = tempfile.mkstemp(prefix="castad-", suffix=path.suffix)
        copy = pathlib.Path(name)
        try:
            with os.fdopen(descriptor, "wb") as out:
                digest = _copied(path, out)
            if digest != artifact.sha256:
                raise artifacts.ArtifactMissing(f"{artifact.uri} no longer has the bytes its event describes")
            yield copy
        finally:
            copy.unlink(missing_ok=True)

    def serve(
        self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage, valid_s: float | None = None
    ) -> pathlib.Path:
        path = self.placed(artifact, pipeline_id, stage)
        if not path.is_file():
            raise artifacts.ArtifactMissing(f"no file at {artifact.uri}")
        return path

    def delete(self, pipeline_id: str, stage: events.Stage) -> int:
        """Delete every file of the stage for the pipeline, in its place and in the layout before; how many."""
        # The layout before first: a file `relayout` moves meanwhile is then in the place, deleted next.
        folders = (layout.checked_id(pipeline_id), layout.folder_of(pipeline_id, stage))
        return sum(layout.delete_local(self.root / folder, stage, final=True) for folder in folders)

    def relayout(self) -> int:
        """Move every stage's file kept in the layout before to the stage's place; how many were moved.

        What an attempt of that release left in a pipeline's folder (scratch and partial files) is deleted, and
        the folder with it once empty. Run once every replica runs this release (none writes the layout before),
        with the whole volume writable.
        """
        moved = 0
        for folder in sorted(self.root.iterdir()):
            if not layout.is_pipeline_id(folder.name) or not folder.is_dir() or folder.is_symlink():
                continue
            for path in sorted(_listed(folder)):
                name = f"{folder.name}/{path.name}"
                if layout.in_layout_before(name) and path.is_file() and not path.is_symlink():
                    target = self.root / layout.moved_name(name)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(FileNotFoundError):  # retention deleted it meanwhile
                        os.replace(path, target)
                        moved += 1
                elif path.name.startswith(_LEFT_BEFORE) and path.is_file():
                    path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()  # refused while something else is still there
        return moved

    def keep_image(self, data: bytes, tenant: str, media_type: str) -> events.Artifact:
        """Write a tenant's image under the name its bytes give it (whole or not at all) and describe it.

        Raises outages.StoreUnavailable if the volume refuses the file (full, mounted read-only)."""
        digest = hashlib.sha256(data).hexdigest()
        final = self.root / layout.image_name(artifacts.image_owner(tenant), digest, artifacts.image_suffix(media_type))
        try:
            _write_whole(final, data)
        except OSError as error:
            raise outages.StoreUnavailable(f"keep an image in {self.root}: {redact.describe(error)}") from None
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=len(data), media_type=media_type)

    @contextlib.contextmanager
    def image_copy(self, photo: brief.Photo) -> Iterator[pathlib.Path]:
        """The file of a photo a brief names, its bytes checked; ArtifactMissing if it is not in this store."""
        path = self.root / layout.photo_name(photo)
        if not path.is_file() or layout.sha256_of(path) != photo.sha256:
            raise artifacts.ArtifactMissing(f"no image {photo.id} with its bytes in {self.root}")
        yield path

    def serve_image(self, photo: brief.Photo, valid_s: float | None = None) -> pathlib.Path:
        """The file of a tenant's image; ArtifactMissing if it is not in this store."""
        path = self.root / layout.photo_name(photo)
        if not path.is_file():
            raise artifacts.ArtifactMissing(f"no image {photo.id} in {self.root}")
        return path

    def keep_fetched(
        self, data: bytes, pipeline_id: str, stage: events.Stage, url: str, media_type: str
    ) -> events.Artifact:
        """Write a file fetched from `url` for the stage of the pipeline (whole or not at all) and describe it.

        Raises outages.StoreUnavailable if the volume refuses the file (full, mounted read-only)."""
        digest = hashlib.sha256(data).hexdigest()
        final = self.root / layout.fetched_name(pipeline_id, stage, url, digest, media_type)
        try:
            _write_whole(final, data)
        except OSError as error:
            raise outages.StoreUnavailable(f"keep a fetched file in {self.root}: {redact.describe(error)}") from None
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=len(data), media_type=media_type)

    @contextlib.contextmanager
    def fetched_copy(self, pipeline_id: str, stage: events.Stage, url: str) -> Iterator[artifacts.Fetched | None]:
        """The file an attempt of the stage of the pipeline fetched from `url` and kept, its bytes checked.

        None if there is none.
        """
        place = layout.fetched_place(pipeline_id, stage, url)
        found = (
            layout.intact(path, path.name, path.as_uri())
            for path in sorted(self.root.glob(f"{place}*"))
            if path.is_file()
        )
        yield next((fetched for fetched in found if fetched is not None), None)

    def made(self, pipeline_id: str, stage: events.Stage, key: str, media_type: str) -> events.Artifact | None:
        """The file an attempt of the stage kept as the part `key` of its work, if one has the bytes its name gives."""
        for path in sorted(self.root.glob(f"{layout.fetched_place(pipeline_id, stage, key)}*")):
            if path.is_file() and layout.named_by(path.name, digest := layout.sha256_of(path)):
                return events.Artifact(
                    uri=path.as_uri(), sha256=digest, size=path.stat().st_size, media_type=media_type
                )
        return None

    def delete_image(self, photo: brief.Photo) -> None:
        """Delete the file of a tenant's image (one already gone is fine).

        Its owner's folder stays, empty or not: an upload of the owner's may have made it a moment ago to write
        into it.

        Raises outages.StoreUnavailable if the volume refuses (mounted read-only)."""
        path = self.root / layout.photo_name(photo)
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            raise outages.StoreUnavailable(f"delete an image in {self.root}: {redact.describe(error)}") from None


def _write_whole(final: pathlib.Path, data: bytes) -> None:
    """Write `final` as a whole or not at all.

    A file beside it, on disk before it takes the name. Its mode is every file's a process here writes (0o666 less
    the umask), as the stages' artifacts get theirs.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    written = final.with_name(f".upload-{uuid.uuid4().hex}")
    try:
        with open(written, "xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(written, final)
    finally:
        written.unlink(missing_ok=True)


# What an attempt of a release up to 0.2 left in a pipeline's folder beside its final files: scratch and partial files.
_LEFT_BEFORE = (*(f".{stage.value}.attempt" for stage in events.Stage), ".upload-")


def _listed(folder: pathlib.Path) -> list[pathlib.Path]:
    """What is in `folder`; nothing if it is gone (retention deleted it meanwhile)."""
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def _copied(path: pathlib.Path, out: Any) -> str:
    """Copy the file at `path` (not through a link at its name) to `out`; the sha256 of what was copied.

    ArtifactMissing if there is no regular file there.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):  # the machine's trouble, not the file's
            raise
        raise artifacts.ArtifactMissing(f"no file at {path}: {error.strerror}") from None
    digest = hashlib.sha256()
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise artifacts.ArtifactMissing(f"{path} is no regular file")
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()
