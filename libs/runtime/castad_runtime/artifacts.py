"""Artifacts: content-addressed files in a shared volume or an S3-compatible bucket.

Both stores name an artifact by its bytes, `<stage>/<pipeline id>/<stage>-<sha256 prefix><suffix>`: each stage
writes in a place of its own, `<stage>/`, which a deployment gives that stage alone to write (its own volume path,
or bucket prefix and credentials) and the stages that read its files to read (the video stage reads `song/`).
An attempt writes its own scratch file (`scratch`, always on local disk), then `keep` moves or
uploads it under the name derived from its bytes. A timed-out attempt may still finish after a
newer one has published its artifact; with content-addressed names its late `keep` either
replaces a file with the same bytes or writes a different one, so the sha256 and size in an
event always describe what is at its URI. A pipeline may therefore hold more than one file of a
stage; only the one named in the stage's completed event is its artifact.

A stage that needs an earlier stage's artifact (the video needs the song) reads it through `local_copy`, its
bytes checked against its event (a deployment may share one place among stages, and it could change); the gateway
serves one through `serve`: a local file (whose bytes the gateway checks as it sends it), or a presigned URL
to redirect to. Both take the pipeline and stage the artifact is asked for, and refuse a file that is not in
their place, `<stage>/<pipeline id>/<stage>-…` (ArtifactMisplaced): an event names its artifact by URI, and whoever
could write an event could otherwise name any file of the store.

Retention deletes every file of a stage of a pipeline through `delete`, the artifact and whatever a late attempt
left beside it. An object store that cannot be reached, or a volume that refuses an uploaded image (full,
read-only), raises outages.StoreUnavailable, the machinery's failure, never the work's.

A tenant's uploaded images are files of their own, named by their bytes under their owner's place,
`images/<owner>/<sha256><suffix>` (`<owner>`: a digest of the tenant's name, which is free text):
`keep_image` stores one, and the same bytes uploaded again by the same tenant are the same file;
`delete_image` deletes one (the gateway's retention, once no image record needs it).

Releases up to 0.2 kept every stage's files in the pipeline's folder, `<pipeline id>/<stage>-…`: the layout before.
Such a file is still read where an event names it, or in its stage's place once `relayout` has moved it there (with
the same name), and `delete` deletes it with the stage's other files.

A file a stage fetched from a URL for its work (a photo a brief names by URL) is a file of the stage of
the pipeline, deleted with its other files: `keep_fetched` stores it whole or not at all as
`<stage>/<pipeline id>/<stage>-<digest of the URL>-<sha256 prefix><suffix>`, named by its bytes as every file is,
and `fetched_copy` finds it again by its URL alone (its bytes checked against its name), so that a later
attempt of the stage reuses what an earlier one fetched rather than fetching it again; both describe it as
an event names it, so the gateway serves it (`serve`, in the stage's place) as any other file of the stage.

A part of a stage's work that an attempt made (one format of a video) is kept the same way under a key of the
stage's own (`keep(..., made_as=key)`), and `made` finds it again by that key, its bytes checked
against its name, so that a later attempt makes only what is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import math
import os
import pathlib
import re
import stat
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from castad_contracts import brief, events

from castad_runtime import db, outages, redact, settings

DIGEST_NAME_CHARS = 16  # hex characters of the sha256 in a final name: 64 bits
# Media types a file is served as (the type its event names comes from a stage): none a browser runs as a page.
SERVED_IMAGES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif"})
OTHERWISE_SERVED_AS = "application/octet-stream"
MAX_PRESIGN_S = 604_800  # a presigned URL (SigV4) is valid a week at most


def attachment(filename: str) -> str:
    """A Content-Disposition offering a file as an attachment named `filename`.

    Only letters, digits, `.`, `-` and `_` are kept (a suffix comes from a stage): nothing to quote or inject.
    """
    return f'attachment; filename="{re.sub(r"[^A-Za-z0-9._-]", "_", filename)}"'


def served_media_type(media_type: str) -> str:
    """The media type a file named as `media_type` is served as.

    Its own if audio, video, plain text or an image that holds no script (not SVG); otherwise
    application/octet-stream.
    """
    kind = media_type.split(";", 1)[0].strip().lower()
    if kind.startswith(("audio/", "video/")) or kind in SERVED_IMAGES or kind == "text/plain":
        return kind
    return OTHERWISE_SERVED_AS


class ArtifactStore(Protocol):
    def scratch(
        self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str
    ) -> contextlib.AbstractContextManager[pathlib.Path]: ...

    def keep(
        self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str, made_as: str | None = None
    ) -> events.Artifact: ...

    def local_copy(
        self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage
    ) -> contextlib.AbstractContextManager[pathlib.Path]: ...

    def serve(
        self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage, valid_s: float | None = None
    ) -> pathlib.Path | str: ...

    def delete(self, pipeline_id: str, stage: events.Stage) -> int: ...

    def relayout(self) -> int: ...

    def keep_image(self, data: bytes, tenant: str, media_type: str) -> events.Artifact: ...

    def image_copy(self, photo: brief.Photo) -> contextlib.AbstractContextManager[pathlib.Path]: ...

    def serve_image(self, photo: brief.Photo, valid_s: float | None = None) -> pathlib.Path | str: ...

    def keep_fetched(
        self, data: bytes, pipeline_id: str, stage: events.Stage, url: str, media_type: str
    ) -> events.Artifact: ...

    def fetched_copy(
        self, pipeline_id: str, stage: events.Stage, url: str
    ) -> contextlib.AbstractContextManager[Fetched | None]: ...

    def delete_image(self, photo: brief.Photo) -> None: ...

    def made(self, pipeline_id: str, stage: events.Stage, key: str, media_type: str) -> events.Artifact | None: ...


@dataclasses.dataclass(frozen=True)
class Fetched:
    """A file a stage fetched and kept: a local copy to read, and the kept file as an event names it."""

    path: pathlib.Path
    artifact: events.Artifact


class ArtifactMissing(LookupError):
    """The artifact is not in this store (another store's, removed, or its bytes changed)."""


class AccessDenied(outages.StoreUnavailable):
    """The store refused these credentials (an outage of the machinery, as any other refusal of the store)."""


class ArtifactMisplaced(ArtifactMissing):
    """The artifact is not in the place of the pipeline and stage it was asked for (another's file)."""


def make_store(config: settings.StoreSettings) -> ArtifactStore:
    if config.artifacts_store == "s3":
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=config.artifacts_s3_endpoint_url,
            region_name=config.artifacts_s3_region,
            config=Config(
                signature_version="s3v4",
                connect_timeout=5,
                read_timeout=60,
                retries={"mode": "standard", "max_attempts": 3},
                s3={"addressing_style": "path" if config.artifacts_s3_endpoint_url else "auto"},
            ),
        )
        assert config.artifacts_s3_bucket is not None  # the settings refuse s3 without a bucket
        return S3Store(
            client,
            config.artifacts_s3_bucket,
            config.artifacts_s3_prefix,
            config.artifacts_dir,
            config.artifacts_presign_s,
        )
    return VolumeStore(config.artifacts_dir)


@contextlib.contextmanager
def _scratch(directory: pathlib.Path, stage: events.Stage, attempt: int, suffix: str) -> Iterator[pathlib.Path]:
    """A file for an attempt to write, removed when the block ends unless it was kept.

    Scratch files of other attempts of the stage (left by a worker that was killed, or by an attempt abandoned while
    it was still writing), and one left under this name, are removed first; the attempt's other scratch files (its
    video beside its poster) stay."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".{stage.value}.attempt{attempt}{suffix}"
    for stale in directory.glob(f".{stage.value}.attempt*"):
        if stale == path or not stale.name.startswith(f".{stage.value}.attempt{attempt}."):
            stale.unlink(missing_ok=True)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _place(pipeline_id: str, stage: events.Stage) -> str:
    """How the name of every final file of a pipeline's stage starts (under the root or the prefix)."""
    return events.artifact_place(pipeline_id, stage)


def _place_before(pipeline_id: str, stage: events.Stage) -> str:
    """How the name of such a file started in the layout before (up to 0.2): in the pipeline's folder."""
    return f"{pipeline_id}/{stage.value}-"


def _folder(pipeline_id: str, stage: events.Stage) -> str:
    """The folder of the stage's files of a pipeline (under the root or the prefix)."""
    return f"{stage.value}/{pipeline_id}"


def _name(pipeline_id: str, stage: events.Stage, digest: str, suffix: str, made_as: str | None = None) -> str:
    """A final file's name: by its bytes, after the digest of the part of the stage's work it is (`made_as`) if any."""
    place = _place(pipeline_id, stage) if made_as is None else _fetched_place(pipeline_id, stage, made_as)
    return f"{place}{digest[:DIGEST_NAME_CHARS]}{suffix}"


def _placed(name: str, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> str | None:
    """Where else a final file of the stage of the pipeline named `name` may be; ArtifactMisplaced if it is none.

    `name` is relative to the root or the prefix; a final file is `<stage>/<pipeline id>/<stage>-<rest>`, or in the
    layout before `<pipeline id>/<stage>-<rest>`, `rest` naming no folder. A file of the layout before may have been
    moved to the stage's place since (`relayout`): its name there is returned; None for a file in its place.
    """
    for place in (_place(pipeline_id, stage), _place_before(pipeline_id, stage)):
        if name.startswith(place) and "/" not in name[len(place) :]:
            return None if place == _place(pipeline_id, stage) else _moved(name)
    raise ArtifactMisplaced(f"{artifact.uri} is not a file of the {stage.value} stage of pipeline {pipeline_id}")


def _moved(name: str) -> str:
    """The name in its stage's place of a file named `name` in the layout before (`<pipeline id>/<stage>-<rest>`)."""
    pipeline_id, file = name.split("/")
    return f"{file.split('-', 1)[0]}/{pipeline_id}/{file}"


def _before(name: str) -> bool:
    """Whether `name` is a final file of a stage in the layout before (a scratch or partial file is not)."""
    folder, _, file = name.partition("/")
    return _is_pipeline_id(folder) and "/" not in file and file.startswith(tuple(f"{s.value}-" for s in events.Stage))


def _is_pipeline_id(name: str) -> bool:
    try:
        _checked(name)
    except ValueError:
        return False
    return True


def image_owner(tenant: str) -> str:
    """The place of a tenant's images: a digest of its name, which is free text."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:32]


def _image_name(owner: str, digest: str, suffix: str) -> str:
    """Where an image with this sha256 of the owner's is kept (under the root or the prefix)."""
    if not re.fullmatch(r"[0-9a-f]{32}", owner) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ArtifactMisplaced(f"not an image's place: {owner}/{digest}")
    return f"images/{owner}/{digest}{suffix}"


def image_suffix(media_type: str) -> str:
    """The suffix of a kept image's file: its media type's subtype (.png, .webp), a JPEG's the usual .jpg."""
    subtype = media_type.removeprefix("image/")
    return ".jpg" if subtype == "jpeg" else f".{subtype}"


def _photo_name(photo: brief.Photo) -> str:
    return _image_name(photo.owner, photo.sha256, image_suffix(photo.media_type))


def _fetched_place(pipeline_id: str, stage: events.Stage, url: str) -> str:
    """How the name of a file fetched from `url` for the stage of the pipeline starts: its URL's digest."""
    return f"{_place(_checked(pipeline_id), stage)}{hashlib.sha256(url.encode()).hexdigest()[:DIGEST_NAME_CHARS]}-"


def _fetched_name(pipeline_id: str, stage: events.Stage, url: str, digest: str, media_type: str) -> str:
    return f"{_fetched_place(pipeline_id, stage, url)}{digest[:DIGEST_NAME_CHARS]}{image_suffix(media_type)}"


def _intact(path: pathlib.Path, name: str, uri: str) -> Fetched | None:
    """A fetched file, copied at `path` and kept as `uri`, if it has the bytes its `name` gives; None if not.

    The name ends `-<sha256 prefix><suffix>`.
    """
    digest, suffix = _sha256(path), pathlib.PurePosixPath(name).suffix
    if not _named_by(name, digest):
        return None
    media_type = "image/jpeg" if suffix == ".jpg" else f"image/{suffix.removeprefix('.')}"
    return Fetched(path, events.Artifact(uri=uri, sha256=digest, size=path.stat().st_size, media_type=media_type))


def _named_by(name: str, digest: str) -> bool:
    """Whether a kept file's `name`, ending `-<sha256 prefix><suffix>`, names the bytes whose sha256 is `digest`."""
    stem = pathlib.PurePosixPath(name).stem
    tail = stem.rsplit("-", 1)[-1]
    return len(tail) == DIGEST_NAME_CHARS and digest.startswith(tail)


def _checked(pipeline_id: str) -> str:
    """A pipeline id, checked before it names a folder or a key prefix to delete."""
    try:
        canonical = str(uuid.UUID(pipeline_id))
    except ValueError:
        canonical = ""
    if canonical != pipeline_id:
        raise ValueError(f"not a pipeline id: {pipeline_id!r}")
    return pipeline_id


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


def _delete_local(directory: pathlib.Path, stage: events.Stage, final: bool) -> int:
    """Delete a stage's files in a pipeline's folder; how many final files were deleted.

    The stage's scratch files go, and its final files if `final`, then the folder if nothing else is left in it.
    """
    deleted = 0
    for path in directory.glob(f".{stage.value}.attempt*"):
        path.unlink(missing_ok=True)
    if final:
        for path in directory.glob(".upload-*"):  # a fetched file's write that its process did not live to finish
            path.unlink(missing_ok=True)
        for path in directory.glob(f"{stage.value}-*"):
            path.unlink(missing_ok=True)
            deleted += 1
    with contextlib.suppress(OSError):
        directory.rmdir()  # refused while another stage's files are still there (or it is gone already)
    return deleted


# What each store does with its volume or bucket: never inside a database transaction (db.outside).
_STORE_WORK = (
    "keep",
    "local_copy",
    "serve",
    "delete",
    "relayout",
    "keep_image",
    "image_copy",
    "serve_image",
    "keep_fetched",
    "fetched_copy",
    "delete_image",
    "made",
)
_Store = TypeVar("_Store")


def _outside_transactions(cls: type[_Store]) -> type[_Store]:
    """The store's work (`_STORE_WORK`) refused inside a database transaction of this thread (db.TransactionOpen)."""
    for name in _STORE_WORK:
        setattr(cls, name, _refused_in_transactions(f"{cls.__name__}.{name}", getattr(cls, name)))
    return cls


def _refused_in_transactions(what: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        db.outside(what)
        return method(*args, **kwargs)

    return checked


@_outside_transactions
class VolumeStore:
    """Files under `root`, a directory of which each stage mounts its own place to write and what it reads."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root.resolve()

    def scratch(
        self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str
    ) -> contextlib.AbstractContextManager[pathlib.Path]:
        return _scratch(self.root / _folder(pipeline_id, stage), stage, attempt, suffix)

    def keep(
        self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str, made_as: str | None = None
    ) -> events.Artifact:
        """Move an attempt's file to its content-addressed final name and describe it.

        `made_as`: the part of the stage's work it is, which `made` finds it by."""
        digest = _sha256(scratch)
        size = scratch.stat().st_size
        final = self.root / _name(pipeline_id, stage, digest, scratch.suffix, made_as)
        os.replace(scratch, final)
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=size, media_type=media_type)

    def path(self, artifact: events.Artifact) -> pathlib.Path:
        """The local file of an artifact; raises ArtifactMissing if it is not under this store."""
        parsed = urllib.parse.urlparse(artifact.uri)
        if parsed.scheme != "file":
            raise ArtifactMissing(f"not a local artifact: {artifact.uri}")
        path = pathlib.Path(urllib.parse.unquote(parsed.path)).resolve()
        if not path.is_relative_to(self.root):
            raise ArtifactMissing(f"artifact outside {self.root}: {artifact.uri}")
        return path

    def placed(self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> pathlib.Path:
        """The local file of an artifact of the stage of the pipeline.

        Raises ArtifactMissing if it is not under this store, ArtifactMisplaced if it is not in that stage's place.
        """
        path = self.path(artifact)
        moved = _placed(path.relative_to(self.root).as_posix(), artifact, pipeline_id, stage)
        if moved is None or os.path.lexists(path):
            return path
        there = (self.root / moved).resolve()  # a link at the moved name is judged where it leads, as any name
        if not there.is_relative_to(self.root) or _placed(
            there.relative_to(self.root).as_posix(), artifact, pipeline_id, stage
        ):
            raise ArtifactMisplaced(
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
                raise ArtifactMissing(f"{artifact.uri} no longer has the bytes its event describes")
            yield copy
        finally:
            copy.unlink(missing_ok=True)

    def serve(
        self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage, valid_s: float | None = None
    ) -> pathlib.Path:
        path = self.placed(artifact, pipeline_id, stage)
        if not path.is_file():
            raise ArtifactMissing(f"no file at {artifact.uri}")
        return path

    def delete(self, pipeline_id: str, stage: events.Stage) -> int:
        """Delete every file of the stage for the pipeline, in its place and in the layout before; how many."""
        # The layout before first: a file `relayout` moves meanwhile is then in the place, deleted next.
        folders = (_checked(pipeline_id), _folder(pipeline_id, stage))
        return sum(_delete_local(self.root / folder, stage, final=True) for folder in folders)

    def relayout(self) -> int:
        """Move every stage's file kept in the layout before to the stage's place; how many were moved.

        What an attempt of that release left in a pipeline's folder (scratch and partial files) is deleted, and
        the folder with it once empty. Run once every replica runs this release (none writes the layout before),
        with the whole volume writable.
        """
        moved = 0
        for folder in sorted(self.root.iterdir()):
            if not _is_pipeline_id(folder.name) or not folder.is_dir() or folder.is_symlink():
                continue
            for path in sorted(_listed(folder)):
                name = f"{folder.name}/{path.name}"
                if _before(name) and path.is_file() and not path.is_symlink():
                    target = self.root / _moved(name)
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
        final = self.root / _image_name(image_owner(tenant), digest, image_suffix(media_type))
        try:
            _write_whole(final, data)
        except OSError as error:
            raise outages.StoreUnavailable(f"keep an image in {self.root}: {redact.describe(error)}") from None
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=len(data), media_type=media_type)

    @contextlib.contextmanager
    def image_copy(self, photo: brief.Photo) -> Iterator[pathlib.Path]:
        """The file of a photo a brief names, its bytes checked; ArtifactMissing if it is not in this store."""
        path = self.root / _photo_name(photo)
        if not path.is_file() or _sha256(path) != photo.sha256:
            raise ArtifactMissing(f"no image {photo.id} with its bytes in {self.root}")
        yield path

    def serve_image(self, photo: brief.Photo, valid_s: float | None = None) -> pathlib.Path:
        """The file of a tenant's image; ArtifactMissing if it is not in this store."""
        path = self.root / _photo_name(photo)
        if not path.is_file():
            raise ArtifactMissing(f"no image {photo.id} in {self.root}")
        return path

    def keep_fetched(
        self, data: bytes, pipeline_id: str, stage: events.Stage, url: str, media_type: str
    ) -> events.Artifact:
        """Write a file fetched from `url` for the stage of the pipeline (whole or not at all) and describe it.

        Raises outages.StoreUnavailable if the volume refuses the file (full, mounted read-only)."""
        digest = hashlib.sha256(data).hexdigest()
        final = self.root / _fetched_name(pipeline_id, stage, url, digest, media_type)
        try:
            _write_whole(final, data)
        except OSError as error:
            raise outages.StoreUnavailable(f"keep a fetched file in {self.root}: {redact.describe(error)}") from None
        return events.Artifact(uri=final.as_uri(), sha256=digest, size=len(data), media_type=media_type)

    @contextlib.contextmanager
    def fetched_copy(self, pipeline_id: str, stage: events.Stage, url: str) -> Iterator[Fetched | None]:
        """The file an attempt of the stage of the pipeline fetched from `url` and kept, its bytes checked.

        None if there is none.
        """
        place = _fetched_place(pipeline_id, stage, url)
        found = (
            _intact(path, path.name, path.as_uri()) for path in sorted(self.root.glob(f"{place}*")) if path.is_file()
        )
        yield next((fetched for fetched in found if fetched is not None), None)

    def made(self, pipeline_id: str, stage: events.Stage, key: str, media_type: str) -> events.Artifact | None:
        """The file an attempt of the stage kept as the part `key` of its work, if one has the bytes its name gives."""
        for path in sorted(self.root.glob(f"{_fetched_place(pipeline_id, stage, key)}*")):
            if path.is_file() and _named_by(path.name, digest := _sha256(path)):
                return events.Artifact(
                    uri=path.as_uri(), sha256=digest, size=path.stat().st_size, media_type=media_type
                )
        return None

    def delete_image(self, photo: brief.Photo) -> None:
        """Delete the file of a tenant's image (one already gone is fine).

        Its owner's folder stays, empty or not: an upload of the owner's may have made it a moment ago to write
        into it.

        Raises outages.StoreUnavailable if the volume refuses (mounted read-only)."""
        path = self.root / _photo_name(photo)
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            raise outages.StoreUnavailable(f"delete an image in {self.root}: {redact.describe(error)}") from None


@_outside_transactions
class S3Store:
    """Objects `<prefix><pipeline id>/<stage>-<sha256 prefix><suffix>` in a bucket; scratch files on local disk."""

    def __init__(self, client: Any, bucket: str, prefix: str, scratch_root: pathlib.Path, presign_s: int) -> None:
        self._client = client
        self.bucket = bucket
        self.prefix = prefix
        self.scratch_root = scratch_root.resolve()
        self.presign_s = presign_s

    def scratch(
        self, pipeline_id: str, stage: events.Stage, attempt: int, suffix: str
    ) -> contextlib.AbstractContextManager[pathlib.Path]:
        return _scratch(self.scratch_root / _folder(pipeline_id, stage), stage, attempt, suffix)

    def keep(
        self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str, made_as: str | None = None
    ) -> events.Artifact:
        """Upload an attempt's file under its content-addressed key and describe it (`made_as`: see VolumeStore)."""
        digest = _sha256(scratch)
        size = scratch.stat().st_size
        key = self.prefix + _name(pipeline_id, stage, digest, scratch.suffix, made_as)
        extra = {"ContentType": media_type, "Metadata": {"sha256": digest}}
        self._call("upload", self._client.upload_file, str(scratch), self.bucket, key, ExtraArgs=extra)
        scratch.unlink(missing_ok=True)
        return events.Artifact(uri=f"s3://{self.bucket}/{key}", sha256=digest, size=size, media_type=media_type)

    @contextlib.contextmanager
    def local_copy(self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> Iterator[pathlib.Path]:
        """The artifact downloaded to a scratch file (its sha256 checked), removed when the block ends."""
        with self._download(artifact, self._key(artifact, pipeline_id, stage)) as path:
            yield path

    @contextlib.contextmanager
    def _download(self, artifact: events.Artifact, key: str) -> Iterator[pathlib.Path]:
        path = self._scratch_download(key)
        try:
            if _sha256(path) != artifact.sha256:
                raise ArtifactMissing(f"{artifact.uri} no longer has the bytes its event describes")
            yield path
        finally:
            path.unlink(missing_ok=True)

    def serve(
        self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage, valid_s: float | None = None
    ) -> str:
        """A presigned URL of the artifact, valid `valid_s` seconds (default `presign_s`)."""
        return self._presigned(self._key(artifact, pipeline_id, stage), artifact.media_type, valid_s)

    def delete(self, pipeline_id: str, stage: events.Stage) -> int:
        """Delete every object of the stage for the pipeline, and its scratch files here; how many objects.

        Objects in the layout before too, unless these credentials may not list them: credentials narrowed to the
        stage's own place are given once `relayout` has moved every such object (docs/deploy.md).
        """
        deleted = 0
        # The layout before first: an object `relayout` copies meanwhile is then in the place, deleted next.
        with contextlib.suppress(AccessDenied):
            deleted += self._delete_listed(self.prefix + _place_before(_checked(pipeline_id), stage))
        deleted += self._delete_listed(self.prefix + _place(pipeline_id, stage))
        _delete_local(self.scratch_root / _folder(pipeline_id, stage), stage, final=False)
        return deleted

    def _delete_listed(self, prefix: str) -> int:
        """Delete every object whose key starts with `prefix`; how many."""
        deleted = 0
        while True:  # what is deleted leaves the listing, so each round lists from the start
            listed = self._call("list", self._client.list_objects_v2, Bucket=self.bucket, Prefix=prefix)
            keys = [{"Key": found["Key"]} for found in listed.get("Contents", [])]
            if not keys:
                return deleted
            answer = self._call("delete", self._client.delete_objects, Bucket=self.bucket, Delete={"Objects": keys})
            if answer.get("Errors"):
                error = answer["Errors"][0]
                raise outages.StoreUnavailable(f"delete in s3://{self.bucket}: {error.get('Code')} {error.get('Key')}")
            deleted += len(keys)

    def relayout(self) -> int:
        """Move (copy, then delete) every stage's object kept in the layout before to the stage's place; how many.

        Run once every replica runs this release, with credentials that may write the whole prefix.
        """
        moved = 0
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in self._call("list", list, pages):
            for found in page.get("Contents", []):
                name = found["Key"][len(self.prefix) :]
                if not _before(name):
                    continue
                with contextlib.suppress(ArtifactMissing):  # retention deleted it meanwhile
                    source = {"Bucket": self.bucket, "Key": found["Key"]}
                    self._call(
                        "copy",
                        self._client.copy_object,
                        Bucket=self.bucket,
                        Key=self.prefix + _moved(name),
                        CopySource=source,
                        MetadataDirective="COPY",
                    )
                    self._call("delete", self._client.delete_object, Bucket=self.bucket, Key=found["Key"])
                    moved += 1
        return moved

    def keep_image(self, data: bytes, tenant: str, media_type: str) -> events.Artifact:
        """Upload a tenant's image under the key its bytes give it and describe it."""
        digest = hashlib.sha256(data).hexdigest()
        return self._put(
            self.prefix + _image_name(image_owner(tenant), digest, image_suffix(media_type)), data, digest, media_type
        )

    @contextlib.contextmanager
    def image_copy(self, photo: brief.Photo) -> Iterator[pathlib.Path]:
        """A photo a brief names, downloaded to a scratch file (its sha256 checked), removed when the block ends."""
        artifact = events.Artifact(
            uri=f"s3://{self.bucket}/{self.prefix}{_photo_name(photo)}",
            sha256=photo.sha256,
            size=photo.size,
            media_type=photo.media_type,
        )
        with self._download(artifact, self.prefix + _photo_name(photo)) as path:
            yield path

    def serve_image(self, photo: brief.Photo, valid_s: float | None = None) -> str:
        """A presigned URL of a tenant's image, valid `valid_s` seconds (default `presign_s`)."""
        return self._presigned(self.prefix + _photo_name(photo), photo.media_type, valid_s)

    def _presigned(self, key: str, media_type: str, valid_s: float | None) -> str:
        """A presigned URL of the object `key`: an attachment of an allowed media type.

        Valid `valid_s` seconds (`presign_s` by default), at most the week SigV4 allows."""
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentType": served_media_type(media_type),
            "ResponseContentDisposition": attachment(key.rsplit("/", 1)[-1]),
        }
        url: str = self._call(
            "presign",
            self._client.generate_presigned_url,
            "get_object",
            Params=params,
            ExpiresIn=min(math.ceil(valid_s or self.presign_s), MAX_PRESIGN_S),
        )
        return url

    def keep_fetched(
        self, data: bytes, pipeline_id: str, stage: events.Stage, url: str, media_type: str
    ) -> events.Artifact:
        """Upload a file fetched from `url` for the stage of the pipeline and describe it."""
        digest = hashlib.sha256(data).hexdigest()
        return self._put(
            self.prefix + _fetched_name(pipeline_id, stage, url, digest, media_type), data, digest, media_type
        )

    def _put(self, key: str, data: bytes, digest: str, media_type: str) -> events.Artifact:
        """Upload `data` (whose sha256 is `digest`) as the object `key`, and describe it."""
        self._call(
            "upload",
            self._client.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ContentType=media_type,
            Metadata={"sha256": digest},
        )
        return events.Artifact(uri=f"s3://{self.bucket}/{key}", sha256=digest, size=len(data), media_type=media_type)

    @contextlib.contextmanager
    def fetched_copy(self, pipeline_id: str, stage: events.Stage, url: str) -> Iterator[Fetched | None]:
        """The file an attempt of the stage fetched from `url` and kept, in a scratch file; None if none.

        The scratch file is downloaded from the store (its bytes checked against its name) and removed when the
        block ends.
        """
        place = self.prefix + _fetched_place(pipeline_id, stage, url)
        listed = self._call("list", self._client.list_objects_v2, Bucket=self.bucket, Prefix=place)
        for key in sorted(found["Key"] for found in listed.get("Contents", [])):
            path = self._scratch_download(key)
            fetched = _intact(path, key, f"s3://{self.bucket}/{key}")
            if fetched is not None:
                try:
                    yield fetched
                finally:
                    path.unlink(missing_ok=True)
                return
            path.unlink(missing_ok=True)
        yield None

    def _scratch_download(self, key: str) -> pathlib.Path:
        """An object downloaded to a new scratch file, the caller's to remove."""
        directory = self.scratch_root / ".downloads"
        directory.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(suffix=pathlib.PurePosixPath(key).suffix, dir=directory)
        os.close(handle)
        path = pathlib.Path(name)
        try:
            self._call("download", self._client.download_file, self.bucket, key, str(path))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def made(self, pipeline_id: str, stage: events.Stage, key: str, media_type: str) -> events.Artifact | None:
        """The object an attempt of the stage kept as the part `key` of its work, if one is whole.

        Whole as far as can be told without downloading it: it was uploaded as a stage keeps one (with the sha256 of
        its bytes in its metadata), and that sha256 is the one its name gives."""
        place = self.prefix + _fetched_place(pipeline_id, stage, key)
        listed = self._call("list", self._client.list_objects_v2, Bucket=self.bucket, Prefix=place)
        for found in sorted(listed.get("Contents", []), key=lambda item: item["Key"]):
            try:
                head = self._call("look up", self._client.head_object, Bucket=self.bucket, Key=found["Key"])
            except ArtifactMissing:
                continue
            digest = head.get("Metadata", {}).get("sha256", "")
            if re.fullmatch(r"[0-9a-f]{64}", digest) and _named_by(found["Key"], digest):
                uri = f"s3://{self.bucket}/{found['Key']}"
                return events.Artifact(uri=uri, sha256=digest, size=int(head["ContentLength"]), media_type=media_type)
        return None

    def delete_image(self, photo: brief.Photo) -> None:
        """Delete the object of a tenant's image (S3 answers alike whether it was there or not)."""
        self._call("delete", self._client.delete_object, Bucket=self.bucket, Key=self.prefix + _photo_name(photo))

    def _key(self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> str:
        """The key of an artifact of the stage of the pipeline.

        ArtifactMissing if it is not in this bucket under the prefix, ArtifactMisplaced if it is not in that
        stage's place.
        """
        parsed = urllib.parse.urlparse(artifact.uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket or not parsed.path.startswith(f"/{self.prefix}"):
            raise ArtifactMissing(f"not an artifact of s3://{self.bucket}/{self.prefix}: {artifact.uri}")
        key = parsed.path[1:]
        moved = _placed(key[len(self.prefix) :], artifact, pipeline_id, stage)
        if moved is not None and not self._exists(key):
            return self.prefix + moved
        return key

    def _exists(self, key: str) -> bool:
        """Whether these credentials find the object `key`.

        Refused counts as not found: credentials narrowed to their places after `relayout` may not even look.
        """
        try:
            self._call("look up", self._client.head_object, Bucket=self.bucket, Key=key)
        except (ArtifactMissing, AccessDenied):
            return False
        return True

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the client; a missing object is ArtifactMissing, any other failure of the store an outage."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey"):
                raise ArtifactMissing(f"{what}: no such object") from None
            if code in ("403", "AccessDenied"):
                raise AccessDenied(f"{what} in s3://{self.bucket}: {redact.describe(error)}") from None
            raise outages.StoreUnavailable(f"{what} in s3://{self.bucket}: {redact.describe(error)}") from None
        except (BotoCoreError, Boto3Error) as error:  # boto3's transfers wrap ClientError in Boto3Error
            raise outages.StoreUnavailable(f"{what} in s3://{self.bucket}: {redact.describe(error)}") from None


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _copied(path: pathlib.Path, out: Any) -> str:
    """Copy the file at `path` (not through a link at its name) to `out`; the sha256 of what was copied.

    ArtifactMissing if there is no regular file there.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):  # the machine's trouble, not the file's
            raise
        raise ArtifactMissing(f"no file at {path}: {error.strerror}") from None
    digest = hashlib.sha256()
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ArtifactMissing(f"{path} is no regular file")
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()
