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

This module holds the stores' protocol (ArtifactStore), their errors, and what their callers share (the media type
a file is served as, an image's owner); the stores are beside it, `volume.VolumeStore` and `s3.S3Store`, and the
names and places they share, `layout`. `make_store` makes the one the settings ask for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import pathlib
import re
from typing import Protocol

from castad_contracts import brief, events

from castad_runtime import outages, settings

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


def image_owner(tenant: str) -> str:
    """The place of a tenant's images: a digest of its name, which is free text."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:32]


def image_suffix(media_type: str) -> str:
    """The suffix of a kept image's file: its media type's subtype (.png, .webp), a JPEG's the usual .jpg."""
    subtype = media_type.removeprefix("image/")
    return ".jpg" if subtype == "jpeg" else f".{subtype}"


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

        from castad_runtime.artifacts import s3  # with boto3, only for a deployment that asks for it

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
        return s3.S3Store(
            client,
            config.artifacts_s3_bucket,
            config.artifacts_s3_prefix,
            config.artifacts_dir,
            config.artifacts_presign_s,
        )
    from castad_runtime.artifacts import volume  # the stores import this module: theirs when one is made

    return volume.VolumeStore(config.artifacts_dir)
