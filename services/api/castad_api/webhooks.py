"""Notices to a brief's `callback_url` when its pipeline ends or a draft waits: every statement on them.

When the projection moves a pipeline to SUCCEEDED, FAILED or CANCELED, it adds a delivery
row in the same transaction (`enqueue`): a notice is never lost and never made twice for one
ending. So it does for each draft a stage made for a person to decide on (`review.requested`,
`enqueue_review`), whose notice carries the draft and a link, signed by the gateway, that shows it
and takes one decision on it without an API key (castad_runtime.links.review_link) until its review
times out. The notice names its tenant. The deliverer (webhook_deliverer.py) claims the due notices, sends each
(webhook_sender.py) and records its tries, by the statements here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from castad_contracts import api, events, ids
from castad_runtime import db, links, outbound
from psycopg.types.json import Jsonb
from pydantic import SecretStr
from sqlalchemy.dialects.postgresql import insert as pg_insert

from castad_api import model, records, webhook_secrets, webhook_slots
from castad_api.tables import pipelines, webhook_attempts, webhook_deliveries

if TYPE_CHECKING:  # settings.py imports retention.py, which comes to this module through dead_letters and projection
    from castad_api.settings import ApiSettings


def event_type(status: model.PipelineStatus) -> str:
    return f"pipeline.{status.value.lower()}"


def refusal(url: str, config: ApiSettings) -> str | None:
    """Why a brief's callback_url cannot be accepted now (before any DNS lookup), or None."""
    if config.webhook_secrets_key is None and config.webhook_secret is None:
        return "this gateway sends no notices: CASTAD_API_WEBHOOK_SECRETS_KEY is not set"
    try:
        outbound.check_url(url, config.webhook_allow_private)
    except outbound.Refused as error:
        return f"must be an https URL of a public address ({error})"
    return None  # a name: checked once resolved, at delivery


def tenant_refusal(conn: sa.Connection, tenant: str, config: ApiSettings) -> str | None:
    """Why the tenant's notices cannot be signed (it has no secret of its own, and none is shared), or None."""
    if config.webhook_secret is not None or webhook_secrets.has_valid(conn, tenant):
        return None
    return f"tenant {tenant!r} has no webhook secret: castad-admin webhook-secrets create --tenant {tenant}"


_ENQUEUE = (
    "INSERT INTO webhook_deliveries (id, pipeline_id, url, host, event_type, payload) VALUES (%s, %s, %s, %s, %s, %s)"
)


def enqueue(
    conn: sa.Connection,
    pipeline: records.Pipeline | records.Locked,
    status: model.PipelineStatus,
    error_code: str | None,
    artifacts: dict[str, Any],
) -> None:
    """Add the notice of a pipeline's end, if its brief asked for one (inside the projection's transaction)."""
    url = pipeline.callback_url
    if not url:
        return
    pipeline_id = str(pipeline.id)
    ended = event_type(status)
    data = {
        "id": pipeline_id,
        "tenant": pipeline.tenant,
        "status": status.value,
        "error_code": error_code if status is not model.PipelineStatus.SUCCEEDED else None,
        "artifacts": {
            stage: api.ArtifactLink.of(str(pipeline_id), events.Stage(stage), artifact).model_dump()
            for stage, artifact in artifacts.items()
        },
        "links": {"self": f"/v1/pipelines/{pipeline_id}"},
    }
    payload = {"type": ended, "timestamp": dt.datetime.now(dt.UTC).isoformat(), "data": data}
    # Time-ordered: one a pipeline, at the pipeline rate; the receiver checks the signature, not the id.
    row = (ids.time_ordered(), pipeline.id, url, webhook_slots.host(url), ended, Jsonb(payload))
    db.run(conn, _ENQUEUE, row)  # in the projection's pipeline


REVIEW_REQUESTED = "review.requested"


def enqueue_review(
    conn: sa.Connection, pipeline: records.Pipeline | records.Locked, draft: events.LyricDrafted
) -> None:
    """Add the notice that a draft waits for a person's decision, if the brief asked for notices."""
    url = pipeline.callback_url
    if not url:
        return
    pipeline_id = str(pipeline.id)
    data = {
        "id": pipeline_id,
        "tenant": pipeline.tenant,
        "status": model.PipelineStatus.AWAITING_REVIEW.value,
        "draft": {
            "id": draft.draft_id,
            "stage": draft.stage.value,
            "round": draft.round,
            "text": draft.lyrics.text(),
            "review_until": draft.review_until.isoformat(),
            "on_timeout": draft.on_timeout,
        },
        "links": {"self": f"/v1/pipelines/{pipeline_id}", "review": f"/v1/pipelines/{pipeline_id}/review"},
    }
    payload = {"type": REVIEW_REQUESTED, "timestamp": draft.drafted_at.isoformat(), "data": data}
    row = (ids.time_ordered(), pipeline.id, url, webhook_slots.host(url), REVIEW_REQUESTED, Jsonb(payload))
    db.run(conn, _ENQUEUE, row)


def with_decide_link(payload: dict[str, Any], link_secret: SecretStr | None) -> dict[str, Any]:
    """A `review.requested` notice with its signed link to decide (`links.decide`), given the gateway's secret.

    Made at each try, the same each time (the link expires with the draft's review)."""
    if payload.get("type") != REVIEW_REQUESTED or link_secret is None:
        return payload
    data, draft = payload["data"], payload["data"]["draft"]
    expires = int(dt.datetime.fromisoformat(draft["review_until"]).timestamp())
    decide = links.review_link(link_secret, data["id"], draft["id"], expires)
    return {**payload, "data": {**data, "links": {**data["links"], "decide": decide}}}


@dataclasses.dataclass(frozen=True)
class Try:
    """A try of a notice: the receiver's answer (`status_code`), or the error that stood for one."""

    number: int
    started_at: dt.datetime
    duration_ms: int
    status_code: int | None
    error: str | None


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A notice of a pipeline's end, with its tries so far."""

    id: uuid.UUID
    url: str
    event_type: str
    status: str  # pending, delivered, failed
    attempts: int
    due_at: dt.datetime
    last_error: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    tries: tuple[Try, ...]


def deliveries(conn: sa.Connection, pipeline_id: uuid.UUID) -> list[Delivery]:
    """The notices of a pipeline, oldest first, each with its tries."""
    d, a = webhook_deliveries, webhook_attempts
    columns = [d.c[field.name] for field in dataclasses.fields(Delivery) if field.name != "tries"]
    rows = conn.execute(sa.select(*columns).where(d.c.pipeline_id == pipeline_id).order_by(d.c.created_at))
    result = []
    for row in rows:
        tried = sa.select(*(a.c[field.name] for field in dataclasses.fields(Try)))
        tries = conn.execute(tried.where(a.c.delivery_id == row.id).order_by(a.c.number))
        result.append(Delivery(**row._asdict(), tries=tuple(Try(**t._asdict()) for t in tries)))
    return result


# -- The deliverer's statements (webhook_deliverer.py) ---------------------------------------------------------


def due(conn: sa.Connection, limit: int, full_hosts: Sequence[str]) -> Sequence[sa.Row[Any]]:
    """Up to `limit` of the most overdue pending notices, each with its pipeline's tenant, locked (others skip them).

    Those of the hosts in `full_hosts` are passed over."""
    query = (
        sa.select(webhook_deliveries, pipelines.c.tenant)
        .outerjoin(pipelines, pipelines.c.id == webhook_deliveries.c.pipeline_id)
        .where(webhook_deliveries.c.status == "pending", webhook_deliveries.c.due_at <= sa.func.now())
        .order_by(webhook_deliveries.c.due_at)
        .limit(limit)
        .with_for_update(of=webhook_deliveries, skip_locked=True)
    )
    if full_hosts:  # a notice made before its host was kept (migration 0015) is read once claimed
        query = query.where(webhook_deliveries.c.host.is_(None) | webhook_deliveries.c.host.not_in(full_hosts))
    return conn.execute(query).all()


def give_up(conn: sa.Connection, delivery_ids: Sequence[uuid.UUID], error: str) -> None:
    """Fail these notices for good."""
    conn.execute(
        webhook_deliveries.update()
        .where(webhook_deliveries.c.id.in_(delivery_ids))
        .values(status="failed", finished_at=sa.func.now(), last_error=error)
    )


def lease(conn: sa.Connection, delivery_ids: Sequence[uuid.UUID], lease: dt.timedelta) -> None:
    """Count a try of each of these notices, and make it due again only after `lease`."""
    conn.execute(
        webhook_deliveries.update()
        .where(webhook_deliveries.c.id.in_(delivery_ids))
        .values(attempts=webhook_deliveries.c.attempts + 1, due_at=sa.func.now() + lease)
    )


def record_try(
    conn: sa.Connection,
    delivery_id: uuid.UUID,
    number: int,
    started: dt.datetime,
    duration_ms: int,
    status_code: int | None,
    error: str | None,
) -> None:
    """Record a try of a notice, unless it is recorded already."""
    conn.execute(
        pg_insert(webhook_attempts)
        .on_conflict_do_nothing()  # a replica that took the notice over after its lease recorded this try
        .values(
            delivery_id=delivery_id,
            number=number,
            started_at=started,
            duration_ms=duration_ms,
            status_code=status_code,
            error=error,
        )
    )


def settle(conn: sa.Connection, delivery_id: uuid.UUID, attempts: int, values: dict[str, Any]) -> None:
    """Set what a try decided of its notice, only while the notice is still that try's.

    Pending at this try's count: a replica that took it over after the lease, or a later try, decides otherwise."""
    mine = (
        (webhook_deliveries.c.id == delivery_id)
        & (webhook_deliveries.c.status == "pending")
        & (webhook_deliveries.c.attempts == attempts)
    )
    conn.execute(webhook_deliveries.update().where(mine).values(**values))


# -- Retention's (retention.py, through repository.forget_ended) -----------------------------------------


def being_tried(pipeline_id: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """Whether the pipeline has a notice still being tried (pending)."""
    return sa.exists().where(webhook_deliveries.c.pipeline_id == pipeline_id, webhook_deliveries.c.status == "pending")


def forget(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> None:
    """Delete the notices of these pipelines, and their tries."""
    notices = sa.select(webhook_deliveries.c.id).where(webhook_deliveries.c.pipeline_id.in_(pipeline_ids))
    conn.execute(webhook_attempts.delete().where(webhook_attempts.c.delivery_id.in_(notices)))
    conn.execute(webhook_deliveries.delete().where(webhook_deliveries.c.pipeline_id.in_(pipeline_ids)))
