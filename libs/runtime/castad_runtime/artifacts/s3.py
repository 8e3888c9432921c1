"""The artifact store in an S3-compatible bucket: objects under a prefix, scratch files on local disk.

Its names and places are castad_runtime.artifacts.layout's, its protocol and errors castad_runtime.artifacts'; the
store on a volume is castad_runtime.artifacts.volume.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import pathlib
import re
import tempfile
import urllib.parse
from collections.abc import Iterator
from typing import Any

from castad_contracts import brief, events

from castad_runtime import artifacts, outages, redact
from castad_runtime.artifacts import layout


@layout.outside_transactions
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
        return layout.scratch_file(self.scratch_root / layout.folder_of(pipeline_id, stage), stage, attempt, suffix)

    def keep(
        self, scratch: pathlib.Path, pipeline_id: str, stage: events.Stage, media_type: str, made_as: str | None = None
    ) -> events.Artifact:
        """Upload an attempt's file under its content-addressed key and describe it (`made_as`: see VolumeStore)."""
        digest = layout.sha256_of(scratch)
        size = scratch.stat().st_size
        key = self.prefix + layout.final_name(pipeline_id, stage, digest, scratch.suffix, made_as)
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
            if layout.sha256_of(path) != artifact.sha256:
                raise artifacts.ArtifactMissing(f"{artifact.uri} no longer has the bytes its event describes")
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
        with contextlib.suppress(artifacts.AccessDenied):
            deleted += self._delete_listed(self.prefix + layout.place_before(layout.checked_id(pipeline_id), stage))
        deleted += self._delete_listed(self.prefix + layout.place_of(pipeline_id, stage))
        layout.delete_local(self.scratch_root / layout.folder_of(pipeline_id, stage), stage, final=False)
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
                if not layout.in_layout_before(name):
                    continue
                with contextlib.suppress(artifacts.ArtifactMissing):  # retention deleted it meanwhile
                    source = {"Bucket": self.bucket, "Key": found["Key"]}
                    self._call(
                        "copy",
                        self._client.copy_object,
                        Bucket=self.bucket,
                        Key=self.prefix + layout.moved_name(name),
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
            self.prefix + layout.image_name(artifacts.image_owner(tenant), digest, artifacts.image_suffix(media_type)),
            data,
            digest,
            media_type,
        )

    @contextlib.contextmanager
    def image_copy(self, photo: brief.Photo) -> Iterator[pathlib.Path]:
        """A photo a brief names, downloaded to a scratch file (its sha256 checked), removed when the block ends."""
        artifact = events.Artifact(
            uri=f"s3://{self.bucket}/{self.prefix}{layout.photo_name(photo)}",
            sha256=photo.sha256,
            size=photo.size,
            media_type=photo.media_type,
        )
        with self._download(artifact, self.prefix + layout.photo_name(photo)) as path:
            yield path

    def serve_image(self, photo: brief.Photo, valid_s: float | None = None) -> str:
        """A presigned URL of a tenant's image, valid `valid_s` seconds (default `presign_s`)."""
        return self._presigned(self.prefix + layout.photo_name(photo), photo.media_type, valid_s)

    def _presigned(self, key: str, media_type: str, valid_s: float | None) -> str:
        """A presigned URL of the object `key`: an attachment of an allowed media type.

        Valid `valid_s` seconds (`presign_s` by default), at most the week SigV4 allows."""
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentType": artifacts.served_media_type(media_type),
            "ResponseContentDisposition": artifacts.attachment(key.rsplit("/", 1)[-1]),
        }
        url: str = self._call(
            "presign",
            self._client.generate_presigned_url,
            "get_object",
            Params=params,
            ExpiresIn=min(math.ceil(valid_s or self.presign_s), artifacts.MAX_PRESIGN_S),
        )
        return url

    def keep_fetched(
        self, data: bytes, pipeline_id: str, stage: events.Stage, url: str, media_type: str
    ) -> events.Artifact:
        """Upload a file fetched from `url` for the stage of the pipeline and describe it."""
        digest = hashlib.sha256(data).hexdigest()
        return self._put(
            self.prefix + layout.fetched_name(pipeline_id, stage, url, digest, media_type), data, digest, media_type
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
    def fetched_copy(self, pipeline_id: str, stage: events.Stage, url: str) -> Iterator[artifacts.Fetched | None]:
        """The file an attempt of the stage fetched from `url` and kept, in a scratch file; None if none.

        The scratch file is downloaded from the store (its bytes checked against its name) and removed when the
        block ends.
        """
        place = self.prefix + layout.fetched_place(pipeline_id, stage, url)
        listed = self._call("list", self._client.list_objects_v2, Bucket=self.bucket, Prefix=place)
        for key in sorted(found["Key"] for found in listed.get("Contents", [])):
            path = self._scratch_download(key)
            fetched = layout.intact(path, key, f"s3://{self.bucket}/{key}")
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
        place = self.prefix + layout.fetched_place(pipeline_id, stage, key)
        listed = self._call("list", self._client.list_objects_v2, Bucket=self.bucket, Prefix=place)
        for found in sorted(listed.get("Contents", []), key=lambda item: item["Key"]):
            try:
                head = self._call("look up", self._client.head_object, Bucket=self.bucket, Key=found["Key"])
            except artifacts.ArtifactMissing:
                continue
            digest = head.get("Metadata", {}).get("sha256", "")
            if re.fullmatch(r"[0-9a-f]{64}", digest) and layout.named_by(found["Key"], digest):
                uri = f"s3://{self.bucket}/{found['Key']}"
                return events.Artifact(uri=uri, sha256=digest, size=int(head["ContentLength"]), media_type=media_type)
        return None

    def delete_image(self, photo: brief.Photo) -> None:
        """Delete the object of a tenant's image (S3 answers alike whether it was there or not)."""
        self._call("delete", self._client.delete_object, Bucket=self.bucket, Key=self.prefix + layout.photo_name(photo))

    def _key(self, artifact: events.Artifact, pipeline_id: str, stage: events.Stage) -> str:
        """The key of an artifact of the stage of the pipeline.

        ArtifactMissing if it is not in this bucket under the prefix, ArtifactMisplaced if it is not in that
        stage's place.
        """
        parsed = urllib.parse.urlparse(artifact.uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket or not parsed.path.startswith(f"/{self.prefix}"):
            raise artifacts.ArtifactMissing(f"not an artifact of s3://{self.bucket}/{self.prefix}: {artifact.uri}")
        key = parsed.path[1:]
        moved = layout.placed(key[len(self.prefix) :], artifact, pipeline_id, stage)
        if moved is not None and not self._exists(key):
            return self.prefix + moved
        return key

    def _exists(self, key: str) -> bool:
        """Whether these credentials find the object `key`.

        Refused counts as not found: credentials narrowed to their places after `relayout` may not even look.
        """
        try:
            self._call("look up", self._client.head_object, Bucket=self.bucket, Key=key)
        except (artifacts.ArtifactMissing, artifacts.AccessDenied):
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
                raise artifacts.ArtifactMissing(f"{what}: no such object") from None
            if code in ("403", "AccessDenied"):
                raise artifacts.AccessDenied(f"{what} in s3://{self.bucket}: {redact.describe(error)}") from None
            raise outages.StoreUnavailable(f"{what} in s3://{self.bucket}: {redact.describe(error)}") from None
        except (BotoCoreError, Boto3Error) as error:  # boto3's transfers wrap ClientError in Boto3Error
            raise outages.StoreUnavailable(f"{what} in s3://{self.bucket}: {redact.describe(error)}") from None
