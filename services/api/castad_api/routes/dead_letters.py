"""Dead letters: messages no queue could handle and outbox rows the relay parked; list, show, replay, discard."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from castad_contracts import api
from castad_runtime import db
from fastapi import APIRouter, Path, Query, status

from castad_api import dead_letters, errors, records
from castad_api.deps import ADMIN_ONLY, AUTH_ERRORS, UNREADABLE, Actor, Admin, GatewayDep

router = APIRouter(
    prefix="/v1/dead-letters", tags=["dead letters"], dependencies=[ADMIN_ONLY], responses={**AUTH_ERRORS, **UNREADABLE}
)
# No control characters: PostgreSQL refuses a NUL, and nothing in a dead letter's fields has one.
FilterQuery = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": api.Problem}}
LetterId = Annotated[int, Path(ge=1, le=2**63 - 1, description="a dead letter's id")]  # a BIGINT


def _summary(row: records.DeadLetter) -> api.DeadLetter:
    return api.DeadLetter(
        id=row.id,
        kind=row.kind,
        status=row.status,
        service=row.service,
        queue=row.queue,
        reason=row.reason,
        event_id=str(row.event_id) if row.event_id else None,
        event_type=row.event_type,
        schema_version=row.schema_version,
        pipeline_id=row.pipeline_id,
        received_at=row.received_at,
        replays=row.replays,
        body_size=row.body_size,
    )


@router.get("", response_model=api.DeadLetterPage)
def list_dead_letters(
    gw: GatewayDep,
    status_: Annotated[str | None, Query(alias="status", pattern="^(dead|replayed|discarded)$")] = None,
    service: FilterQuery = None,
    event_type: FilterQuery = None,
    reason: FilterQuery = None,
    pipeline_id: FilterQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(pattern="^[0-9]{1,18}$")] = None,
) -> api.DeadLetterPage:
    """Newest first, filtered by status, service, event type, a part of the reason, pipeline."""
    filters = dead_letters.LetterFilters(status_, service, event_type, reason, pipeline_id)
    limit = min(limit, gw.config.page_size_max)
    with gw.engine.connect() as conn:
        rows = dead_letters.dead_letters(conn, filters, int(cursor) if cursor else None, limit + 1)
    page = rows[:limit]
    next_cursor = str(page[-1].id) if len(rows) > limit else None
    return api.DeadLetterPage(items=[_summary(row) for row in page], next_cursor=next_cursor)


@router.get("/{letter_id}", response_model=api.DeadLetterDetail, responses=NOT_FOUND)
def get_dead_letter(letter_id: LetterId, gw: GatewayDep) -> api.DeadLetterDetail:
    """One dead letter with its headers, its body as received (capped) and what operators did with it."""
    with gw.engine.connect() as conn:
        row = dead_letters.get_dead_letter(conn, letter_id)
        if row is None:
            raise errors.NotFound(f"no dead letter {letter_id}")
        actions = dead_letters.dead_letter_actions(conn, letter_id)
    body = bytes(row.body)
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode(), "base64"
    return api.DeadLetterDetail(
        **_summary(row).model_dump(),
        headers=row.headers,
        body=text,
        body_encoding=encoding,
        body_truncated=row.body_size > len(body),
        actions=[
            api.DeadLetterAction(
                action=a.action,
                actor=a.actor,
                key_id=str(a.key_id) if a.key_id else None,
                key_name=a.key_name,
                detail=a.detail,
                at=a.at,
            )
            for a in actions
        ],
    )


@router.post(
    "/{letter_id}/replay",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.Replayed,
    responses={  # 422 as every other: FastAPI's validation error
        **NOT_FOUND,
        409: {
            "model": api.Conflict,
            "description": "it was discarded, or its event is older than consumers remember (CASTAD_RETENTION_INBOX_S)",
        },
    },
)
def replay_dead_letter(letter_id: LetterId, gw: GatewayDep, who: Admin, actor: Actor = "anonymous") -> api.Replayed:
    """Replay a dead letter: send it back to its queue, or hand a parked outbox row back to the relay.

    A message is upcast to the newest version of its type the gateway knows. Replaying twice is harmless. A message
    whose event is older than CASTAD_RETENTION_INBOX_S (less an hour) is refused: its consumer may have forgotten
    it.
    """
    with db.transaction(gw.engine) as conn:
        detail = dead_letters.replay(conn, letter_id, actor, gw.config.retention_policy(), who.acting())
    return api.Replayed(id=letter_id, detail=detail)


@router.post("/replay", status_code=status.HTTP_202_ACCEPTED, response_model=api.BulkReplayed)
def replay_dead_letters(
    body: api.DeadLetterFilter, gw: GatewayDep, who: Admin, actor: Actor = "anonymous"
) -> api.BulkReplayed:
    """Replay every dead letter still `dead` that matches the filter, up to `limit`."""
    filters = dead_letters.LetterFilters(None, body.service, body.event_type, body.reason, body.pipeline_id)
    with db.transaction(gw.engine) as conn:
        replayed, refused = dead_letters.replay_matching(
            conn, filters, actor, body.limit, gw.config.retention_policy(), who.acting()
        )
    return api.BulkReplayed(replayed=replayed, refused=refused)


@router.post("/{letter_id}/discard", status_code=status.HTTP_200_OK, response_model=api.DeadLetter, responses=NOT_FOUND)
def discard_dead_letter(
    letter_id: LetterId, body: api.Discard, gw: GatewayDep, who: Admin, actor: Actor = "anonymous"
) -> api.DeadLetter:
    """Give up on it, with a reason: it stays listed as discarded."""
    with db.transaction(gw.engine) as conn:
        dead_letters.discard(conn, letter_id, actor, body.reason, who.acting())
        row = dead_letters.get_dead_letter(conn, letter_id)
    assert row is not None  # discarded just now, in this transaction
    return _summary(row)
