"""The names and places of an artifact store's files, which both stores share, and the checks on them.

A final file is `<stage>/<pipeline id>/<stage>-<sha256 prefix><suffix>` (under the volume's root or the bucket's
prefix), or `<pipeline id>/<stage>-…` in the layout before; a fetched file or a part of a stage's work adds the
digest of its URL or key; an image is `images/<owner>/<sha256><suffix>`. Here too: an attempt's scratch file, the
deletion of a stage's local files, and the guard that keeps a store's work out of database transactions. The
stores: castad_runtime.artifacts.volume and castad_runtime.artifacts.s3; their errors: castad_runtime.artifacts.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import pathlib
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from castad_contracts import brief, events

from castad_runtime import artifacts, db

DIGEST_NAME_CHARS = 16  # hex characters of the sha256 in a final name: 64 bits


@contextlib.contextmanager
def scratch_file(directory: pathlib.Path, stage: events.Stage, attempt: int, suffix: str) -> Iterator[pathlib.Path]:
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


def place_of(pipeline_id: str, stage: events.Stage) -> str:
    """How the name of every final file of a pipeline's stage starts (under the root or the prefix)."""
    return events.artifact_place(pipeline_id, stage)


def place_before(pipeline_id: str, stage: events.Stage) -> str:
    """How the name of such a file started in the layout before (up to 0.2): in the pipeline's folder."""
    return f"{pipeline_id}/{stage.value}-"


def folder_of(pipeline_id: str, stage: events.Stage) -> str:
    """The folder of the stage's files of a pipeline (under the root or the prefix)."""
    return f"{stage.value}/{pipeline_id}"


def final_name(pipeline_id: str, stage: events.Stage, digest: str, suffix: str, made_as: str | None = None) -> str:
    """A final file's name: by its bytes, after the digest of the part of the stage's work it is (`made_as`) if any."""
    place = place_of(pipeline_id, stage) if made_as is None else fetched_place(pipeline_id, stage, made_as)
    return f"{place}{digest[:DIGEST_NAME_CHARS]}{suffix}"


def placed(name: str, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> str | None:
    """Where else a final file of the stage of the pipeline named `name` may be; ArtifactMisplaced if it is none.

    `name` is relative to the root or the prefix; a final file is `<stage>/<pipeline id>/<stage>-<rest>`, or in the
    layout before `<pipeline id>/<stage>-<rest>`, `rest` naming no folder. A file of the layout before may have been
    moved to the stage's place since (`relayout`): its name there is returned; None for a file in its place.
    """
    for place in (place_of(pipeline_id, stage), place_before(pipeline_id, stage)):
        if name.startswith(place) and "/" not in name[len(place) :]:
            return None if place == place_of(pipeline_id, stage) else moved_name(name)
    raise artifacts.ArtifactMisplaced(
        f"{artifact.uri} is not a file of the {stage.value} stage of pipeline {pipeline_id}"
    )


def moved_name(name: str) -> str:
    """The name in its stage's place of a file named `name` in the layout before (`<pipeline id>/<stage>-<rest>`)."""
    pipeline_id, file = name.split("/")
    return f"{file.split('-', 1)[0]}/{pipeline_id}/{file}"


def in_layout_before(name: str) -> bool:
    """Whether `name` is a final file of a stage in the layout before (a scratch or partial file is not)."""
    folder, _, file = name.partition("/")
    return is_pipeline_id(folder) and "/" not in file and file.startswith(tuple(f"{s.value}-" for s in events.Stage))


def is_pipeline_id(name: str) -> bool:
    """Whether `name` is a pipeline id (a folder of the layout before)."""
    try:
        checked_id(name)
    except ValueError:
        return False
    return True


def image_name(owner: str, digest: str, suffix: str) -> str:
    """Where an image with this sha256 of the owner's is kept (under the root or the prefix)."""
    if not re.fullmatch(r"[0-9a-f]{32}", owner) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise artifacts.ArtifactMisplaced(f"not an image's place: {owner}/{digest}")
    return f"images/{owner}/{digest}{suffix}"


def photo_name(photo: brief.Photo) -> str:
    """Where the image a brief's photo names is kept."""
    return image_name(photo.owner, photo.sha256, artifacts.image_suffix(photo.media_type))


def fetched_place(pipeline_id: str, stage: events.Stage, url: str) -> str:
    """How the name of a file fetched from `url` for the stage of the pipeline starts: its URL's digest."""
    return f"{place_of(checked_id(pipeline_id), stage)}{hashlib.sha256(url.encode()).hexdigest()[:DIGEST_NAME_CHARS]}-"


def fetched_name(pipeline_id: str, stage: events.Stage, url: str, digest: str, media_type: str) -> str:
    """A fetched file's name: its URL's digest, then its bytes'."""
    return f"{fetched_place(pipeline_id, stage, url)}{digest[:DIGEST_NAME_CHARS]}{artifacts.image_suffix(media_type)}"


def intact(path: pathlib.Path, name: str, uri: str) -> artifacts.Fetched | None:
    """A fetched file, copied at `path` and kept as `uri`, if it has the bytes its `name` gives; None if not.

    The name ends `-<sha256 prefix><suffix>`.
    """
    digest, suffix = sha256_of(path), pathlib.PurePosixPath(name).suffix
    if not named_by(name, digest):
        return None
    media_type = "image/jpeg" if suffix == ".jpg" else f"image/{suffix.removeprefix('.')}"
    return artifacts.Fetched(
        path, events.Artifact(uri=uri, sha256=digest, size=path.stat().st_size, media_type=media_type)
    )


def named_by(name: str, digest: str) -> bool:
    """Whether a kept file's `name`, ending `-<sha256 prefix><suffix>`, names the bytes whose sha256 is `digest`."""
    stem = pathlib.PurePosixPath(name).stem
    tail = stem.rsplit("-", 1)[-1]
    return len(tail) == DIGEST_NAME_CHARS and digest.startswith(tail)


def checked_id(pipeline_id: str) -> str:
    """A pipeline id, checked before it names a folder or a key prefix to delete."""
    try:
        canonical = str(uuid.UUID(pipeline_id))
    except ValueError:
        canonical = ""
    if canonical != pipeline_id:
        raise ValueError(f"not a pipeline id: {pipeline_id!r}")
    return pipeline_id


def delete_local(directory: pathlib.Path, stage: events.Stage, final: bool) -> int:
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
STORE_WORK = (
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


def outside_transactions(cls: type[_Store]) -> type[_Store]:
    """The store's work (`STORE_WORK`) refused inside a database transaction of this thread (db.TransactionOpen)."""
    for name in STORE_WORK:
        setattr(cls, name, _refused_in_transactions(f"{cls.__name__}.{name}", getattr(cls, name)))
    return cls


def _refused_in_transactions(what: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        db.outside(what)
        return method(*args, **kwargs)

    return checked


def sha256_of(path: pathlib.Path) -> str:
    """The sha256 of the file at `path`, in hex."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
