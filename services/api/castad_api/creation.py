"""A pipeline made: a brief accepted with its photos checked, or an ended pipeline remade from one of its stages.

Each is recorded in the gateway's database with the event that asks the stages for it (`pipeline.requested`),
once for an Idempotency-Key, and is the first entry of the pipeline's timeline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import uuid

import pydantic
import sqlalchemy as sa
from castad_contracts import api, brief, events, topology
from castad_contracts import envelope as envelope_
from castad_runtime import artifacts, links, outbound, outbox, telemetry
from pydantic import SecretStr

from castad_api import brands, errors, model, projection, repository, retention, uploaded, usage

SOURCE = topology.SOURCES[topology.GATEWAY]


@dataclasses.dataclass(frozen=True)
class Accepted:
    pipeline_id: uuid.UUID
    status: model.PipelineStatus
    created: bool  # False: the Idempotency-Key had been used for this body before


def create(
    conn: sa.Connection,
    body: api.PipelineRequest,
    tenant: str,
    key: str,
    deadline_s: float,
    link_secret: SecretStr | None = None,
    remake: Remade | None = None,
) -> Accepted:
    """Accept a brief and publish pipeline.requested.

    The same key and body again: the same pipeline. The same key with another body is a Conflict. The callback URL
    stays with the gateway. With the gateway's link secret, each uploaded photo the event names is sealed for the
    pipeline (`links.sealed`), which the video stage checks. `remake`: the brief remakes another pipeline (`remake`).
    """
    digest = remake.digest if remake else request_hash(body)
    try:
        named = photos(conn, body, tenant)
    except errors.InvalidField:
        # A replay answers the pipeline its key made as it was: an image its brief named may be gone since.
        made = repository.keyed_pipeline(conn, tenant, key)
        if made is None:
            raise
        return _replayed(conn, made, key, digest)
    if remake is not None and not remake.tenants_kit:
        kit = remake.kit
    else:
        kit = brands.for_pipeline(conn, tenant) if body.brand == "tenant" else None
    source = body.for_stages(named, kit)
    # Random, not time-ordered (castad_contracts.ids): every URL of the pipeline names it, and it must not be
    # guessed nor tell when the pipeline was made.
    pipeline_id = uuid.uuid4()
    # The envelope first: the pipeline keeps its trace id, the one trace its events all belong to.
    # As the stages get it; the pipeline keeps it unsealed, as its tenant sent it.
    told = source if link_secret is None else _sealed(source, link_secret, str(pipeline_id))
    requested = events.PipelineRequested(
        pipeline_id=str(pipeline_id),
        brief=told,
        requested_at=dt.datetime.now(dt.UTC),
        review=body.review,
        remake=remake.what if remake else None,
        share=usage.share(conn, tenant),
    )
    env = envelope_.wrap(requested, events.PIPELINE_REQUESTED, SOURCE, *telemetry.current_trace_headers())
    created = repository.create_pipeline(
        conn,
        pipeline_id,
        tenant,
        key,
        digest,
        source.model_dump(mode="json"),
        body.callback_url,
        deadline_s,
        model.trace_id(env.traceparent),
        body.review.model_dump(mode="json") if body.review else None,
        remake.what if remake else None,
    )
    if created.new:
        outbox.append(conn, env)
        projection.record_request(conn, created.pipeline_id, env)
        return Accepted(created.pipeline_id, model.PipelineStatus.PENDING, True)
    return _replayed(conn, created, key, digest)


@dataclasses.dataclass(frozen=True)
class Remade:
    """What makes a brief a remake (`remake`): the remade pipeline and stage, its key's digest, its brand kit.

    `kit`: the remade pipeline's kit, or none; `tenants_kit`: the tenant's kit as it is now instead."""

    what: events.Remake
    digest: str
    kit: brief.Brand | None
    tenants_kit: bool = False


def remake(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    body: api.RemakeRequest,
    tenant: str,
    key: str,
    deadline_s: float,
    policy: retention.Policy,
    link_secret: SecretStr | None = None,
    allow_private: bool = False,
) -> Accepted:
    """Make the tenant's ended pipeline again from `body.from_` on, with `body.changes`: a new pipeline.

    The stages before reuse their output of it (castad_runtime.stage.remakes). NotFound; a Conflict if a stage before
    did not succeed, or retention deletes its files before the remake could copy them; InvalidField naming the
    change a brief cannot take. The same key and body again: the same remake.
    """
    source = repository.get_pipeline(conn, pipeline_id, tenant)
    if source is None:
        raise errors.NotFound(f"no pipeline {pipeline_id}")
    status = model.PipelineStatus(source.status)
    start = events.Stage(body.from_)
    stages = {row.stage: row for row in repository.get_stages(conn, [pipeline_id])[pipeline_id]}
    reused = events.STAGE_ORDER[: events.STAGE_ORDER.index(start)]
    if not status.terminal or any(
        (row := stages.get(stage.value)) is None or row.status is not model.StageStatus.SUCCEEDED for stage in reused
    ):
        raise errors.Conflict(
            f"pipeline {pipeline_id} is {status.value}: a remake from {start.value} needs it ended, with"
            f" {' and '.join(stage.value for stage in reused)} succeeded",
            status.value,
        )
    ended = {row.stage: row.finished_at for row in stages.values() if row.finished_at is not None}
    refused = policy.retry_refusal(ended, repository.now(conn))
    if refused:
        raise errors.Conflict(f"pipeline {pipeline_id} can no longer be remade: {refused}", status.value)
    was = brief.Brief.model_validate(source.brief)
    photos = [photo.id if isinstance(photo, brief.Photo) else photo.url for photo in was.photos]
    fields = {
        **was.model_dump(mode="json", exclude={"photos", "brand"}),
        "photos": photos,
        "callback_url": body.callback_url,
        **body.changes.model_dump(mode="json", exclude_unset=True, exclude={"brand"}),
    }
    if body.changes.orientation is not None and body.changes.formats is None:
        fields["formats"] = []  # the new orientation's one format, unless formats are given too
    try:
        request = api.PipelineRequest.model_validate(fields)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        loc = ("body", "changes", *first["loc"][:1]) if first["loc"] else ("body", "changes")
        raise errors.InvalidField(loc, f"the remade brief: {first['msg']}") from None
    try:
        check_photo_urls(request, allow_private)
    except errors.InvalidField as unfetchable:
        loc = ("body", "changes", *unfetchable.loc[1:])
        raise errors.InvalidField(loc, str(unfetchable), unfetchable.given) from None
    given = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
    digest = hashlib.sha256(json.dumps({"remake": str(pipeline_id), **given}, sort_keys=True).encode()).hexdigest()
    what = events.Remake(of=str(pipeline_id), stage=start)
    kit = None if body.changes.brand == "none" else was.brand
    remade = Remade(what, digest, kit, tenants_kit=body.changes.brand == "tenant")
    try:
        return create(conn, request, tenant, key, deadline_s, link_secret, remade)
    except errors.InvalidField as unknown:
        if unknown.loc[:2] != ("body", "photos"):
            raise
        if body.changes.photos is not None:  # one of the changes' photos
            raise errors.InvalidField(("body", "changes", *unknown.loc[1:]), str(unknown), unknown.given) from None
        raise errors.Conflict(
            f"pipeline {pipeline_id} can no longer be remade: a photo it showed is no longer kept ({unknown})",
            status.value,
        ) from None


def _sealed(source: brief.Brief, link_secret: SecretStr, pipeline_id: str) -> brief.Brief:
    """The brief with each upload it names, a photo or its brand's logo, sealed for the pipeline."""
    update: dict[str, object] = {}
    if source.photos:
        update["photos"] = links.sealed(link_secret, pipeline_id, source.photos)
    if source.brand is not None and source.brand.logo is not None:
        [logo] = links.sealed(link_secret, pipeline_id, (source.brand.logo,))
        update["brand"] = source.brand.model_copy(update={"logo": logo})
    return source.model_copy(update=update) if update else source


def _replayed(conn: sa.Connection, made: repository.Created, key: str, digest: str) -> Accepted:
    """The pipeline the key made before, for a request of the same body (`digest`); a Conflict for another."""
    if made.request_hash != digest:
        raise errors.Conflict(
            f"Idempotency-Key {key!r} was already used with a different request body; use a new key", "conflict"
        )
    pipeline = repository.get_pipeline(conn, made.pipeline_id)
    assert pipeline is not None
    return Accepted(made.pipeline_id, model.PipelineStatus(pipeline.status), False)


def photos(conn: sa.Connection, body: api.PipelineRequest, tenant: str) -> tuple[brief.Photo | brief.PhotoLink, ...]:
    """The photos the request names, as the stages get them.

    An upload by reference, a URL as it is; InvalidField naming the first id that is not an image the tenant
    uploaded (another tenant's is refused in the same words as one that does not exist).
    """
    ids = [uuid.UUID(name) for name in body.photos if "://" not in name]
    found = uploaded.tenant_images(conn, ids, tenant)
    owner = artifacts.image_owner(tenant)
    named: list[brief.Photo | brief.PhotoLink] = []
    for index, name in enumerate(body.photos):
        if "://" in name:
            named.append(brief.PhotoLink(url=name))
            continue
        row = found.get(uuid.UUID(name))
        if row is None:
            raise errors.InvalidField(("body", "photos", index), f"no image {name} was uploaded by this tenant", name)
        named.append(brief.Photo(id=name, owner=owner, sha256=row.sha256, media_type=row.media_type, size=row.size))
    return tuple(named)


def check_photo_urls(body: api.PipelineRequest, allow_private: bool) -> None:
    """Refuse the first photo URL the video stage would refuse to fetch, without a network call.

    Raises InvalidField naming it, as far as can be told without a lookup: plain http, a private address written in
    it, this machine's name. The stage checks every address again when it fetches.
    """
    for index, name in enumerate(body.photos):
        if "://" not in name:
            continue
        try:
            outbound.check_url(name, allow_private)
        except outbound.Refused as error:
            raise errors.InvalidField(
                ("body", "photos", index), f"must be an https URL of a public address ({error})", name
            ) from None


def request_hash(body: api.PipelineRequest) -> str:
    """The request's digest; without a callback_url, photos, formats or review, of the rest alone (as before them).

    The orientation as the brief has it, whether the request said it or not (before formats it always had one)."""
    unset = {"callback_url"} if body.callback_url is None else set()
    unset |= {"photos"} if not body.photos else set()
    unset |= {"formats"} if not body.formats else set()
    unset |= {"review"} if body.review is None else set()
    fields = body.model_dump(mode="json", exclude=unset or None)
    fields["orientation"] = body.for_stages(()).orientation.value
    canonical = json.dumps(fields, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
