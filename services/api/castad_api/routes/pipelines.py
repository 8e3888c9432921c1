"""What is asked of pipelines: create one, remake it, cancel or retry it; providers' callbacks.

A pipeline as read, listed and followed: routes/pipeline_views.py; its files: routes/downloads.py; the notices of
its end: routes/webhooks.py."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import sqlalchemy as sa
from castad_contracts import api, events
from castad_runtime import db
from fastapi import APIRouter, Depends, Header, HTTPException, status
from fastapi.responses import Response

from castad_api import (
    buckets,
    creation,
    deps,
    errors,
    keys,
    operations,
    usage,
    webhooks,
)
from castad_api.deps import Actor, Gateway, GatewayDep, Operator, Submitter
from castad_api.routes.common import LINK_ERRORS, SIGNED_LINK, links, require_json

log = logging.getLogger(__name__)
IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="client-chosen key; the same key and body always give the same pipeline",
    ),
]
router = APIRouter(prefix="/v1", tags=["pipelines"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})


# A creation past its tenant's budget (usage.py): the message names the limit and when it resets.
OVER_BUDGET: dict[int | str, dict[str, Any]] = {
    402: {
        "model": api.Problem,
        "description": "the tenant's budget of seconds of song or of estimated cost for the day or month is reached"
        " (see Retry-After: when it resets)",
    }
}


class _OverLimit(Exception):
    """The key made too many pipelines this minute: the next may come in `wait_s`."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(wait_s)
        self.wait_s = wait_s


def _too_many(gw: Gateway, wait_s: float) -> HTTPException:
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        f"this key may create {gw.config.creations_per_minute} pipelines a minute",
        {"Retry-After": buckets.retry_after(wait_s)},
    )


@router.post(
    "/pipelines",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.PipelineAccepted,
    dependencies=[deps.SUBMIT_ONLY, Depends(require_json)],
    responses={
        409: {"model": api.Problem, "description": "the Idempotency-Key was used with another body"},
        413: {"model": api.Problem},
        415: {"model": api.Problem},
        402: OVER_BUDGET[402],
        429: {
            "model": api.Problem,
            "description": "the key made too many pipelines this minute, its tenant's budget of pipelines is reached,"
            " or its client address failed authentication too often (see Retry-After)",
        },
    },
)
def create_pipeline(
    body: api.PipelineRequest, key: IdempotencyKey, gw: GatewayDep, who: Submitter
) -> api.PipelineAccepted:
    """Accept a brief; publishes pipeline.requested.

    Replays of the same key and body are answered alike (an Idempotency-Key is the tenant's own: another tenant's
    same key makes another pipeline).
    """
    creation.check_photo_urls(body, gw.config.photo_allow_private)
    return _accepted(
        gw,
        who,
        body.callback_url,
        lambda conn: creation.create(conn, body, who.tenant, key, gw.config.pipeline_deadline_s, gw.config.link_secret),
    )


def _accepted(
    gw: Gateway,
    who: keys.Principal,
    callback_url: str | None,
    make: Callable[[sa.Connection], creation.Accepted],
) -> api.PipelineAccepted:
    """A pipeline `make` creates in a transaction, as a creation of the key (a new brief, a remake).

    Refused first for a callback URL no notice may go to, or a key that made too many pipelines this minute; then,
    made, if it takes its tenant past a budget.
    """
    refused = callback_url and webhooks.refusal(callback_url, gw.config)
    if callback_url and not refused:
        with gw.engine.connect() as conn:
            refused = webhooks.tenant_refusal(conn, who.tenant, gw.config)
    if refused:
        raise errors.invalid(("body", "callback_url"), refused, callback_url)
    if who.minute.created >= gw.config.creations_per_minute:  # used up when the key was read: no work at all
        raise _too_many(gw, who.minute.retry_after_s())
    try:
        with db.transaction(gw.engine) as conn:
            accepted = make(conn)
            if accepted.created:  # counted in the tenant's usage, within its budgets (or rolled back: OverBudget)
                usage.admit(conn, who.tenant, gw.config.prices)
                db.after_commit(conn, lambda: gw.metrics.used(who.tenant, {api.Meter.PIPELINES: 1}))
            # Counted last: every creation of the key waits for the lock of its counter, held until the commit.
            # This count decides: creations of other requests or replicas may have come since the key was read.
            wait_s = keys.count_creation(conn, who.key_id, gw.config.creations_per_minute)
            if wait_s is not None:
                raise _OverLimit(wait_s)  # the creation is rolled back
    except _OverLimit as over:
        raise _too_many(gw, over.wait_s) from None
    if accepted.created:
        gw.metrics.pipelines_created.inc()
    pipeline_id = str(accepted.pipeline_id)
    return api.PipelineAccepted(
        id=pipeline_id, status=accepted.status.value, created=accepted.created, links=links(pipeline_id)
    )


@router.post(
    "/pipelines/{pipeline_id}/remake",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.PipelineAccepted,
    dependencies=[deps.SUBMIT_ONLY, Depends(require_json)],
    responses={
        404: {"model": api.Problem},
        409: {
            "model": api.Conflict,
            "description": "the pipeline has not ended with the stages before the one made again succeeded, retention"
            " deletes their files before the remake could copy them, or the Idempotency-Key was used with another"
            " body",
        },
        413: {"model": api.Problem},
        415: {"model": api.Problem},
        402: OVER_BUDGET[402],
        429: {
            "model": api.Problem,
            "description": "the key made too many pipelines this minute, or its tenant's budget of pipelines is reached"
            " (see Retry-After)",
        },
    },
)
def remake_pipeline(
    pipeline_id: uuid.UUID, body: api.RemakeRequest, key: IdempotencyKey, gw: GatewayDep, who: Submitter
) -> api.PipelineAccepted:
    """Make an ended pipeline again from `from` on, with `changes`: a new pipeline, linked both ways.

    The stages before `from` copy their files of it (no provider is asked again, nothing is paid for again): from
    `video`, a new video of the same song (orientation, formats, photos, brand); from `song`, a new song of the same
    lyrics (its genre too) and its video. It counts as a creation of the key.
    """
    return _accepted(
        gw,
        who,
        body.callback_url,
        lambda conn: creation.remake(
            conn,
            pipeline_id,
            body,
            who.tenant,
            key,
            gw.config.pipeline_deadline_s,
            gw.config.retention_policy(),
            gw.config.link_secret,
            gw.config.photo_allow_private,
        ),
    )


@router.post(
    "/pipelines/{pipeline_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.ActionAccepted,
    responses={
        404: {"model": api.Problem},
        409: {"model": api.Conflict, "description": "the pipeline had already ended SUCCEEDED or FAILED"},
    },
)
def cancel_pipeline(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    who: Operator,
    actor: Actor = "anonymous",
    body: api.CancelRequest | None = None,
) -> api.ActionAccepted:
    """Cancel a pipeline that has not ended.

    Every stage stops its job (a running attempt is stopped, a stage not reached yet never starts), a stage that
    completed keeps its artifact. Idempotent: asking again gives 202 and changes nothing. The status is CANCELING
    until every stage has answered, then CANCELED.
    """
    reason = (body or api.CancelRequest()).reason
    with db.transaction(gw.engine) as conn:
        done = operations.cancel(conn, pipeline_id, reason, actor, who.tenant_filter(), who.acting())
    return api.ActionAccepted(
        id=str(pipeline_id), status=done.status.value, operation=done.operation, links=links(str(pipeline_id))
    )


@router.post(
    "/pipelines/{pipeline_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.ActionAccepted,
    responses={
        404: {"model": api.Problem},
        409: {
            "model": api.Conflict,
            "description": "the pipeline is not FAILED or CANCELED, or it ended so long ago that retention deletes"
            " its stages' jobs or files before a retry could end",
        },
    },
)
def retry_pipeline(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    who: Operator,
    actor: Actor = "anonymous",
    body: api.RetryRequest | None = None,
) -> api.ActionAccepted:
    """Resume a FAILED or CANCELED pipeline at its first stage that did not succeed.

    It gets a fresh attempt budget (`max_attempts` per stage, optional); stages that succeeded keep their artifacts
    and are not run again. The pipeline gets a fresh deadline. A pipeline can be retried until
    CASTAD_RETENTION_ARTIFACTS_S, less its deadline and an hour, after the first of its stages ended.
    """
    overrides = (body or api.RetryRequest()).max_attempts
    with db.transaction(gw.engine) as conn:
        done, resume = operations.retry(
            conn, pipeline_id, overrides, gw.config.retention_policy(), actor, who.tenant_filter(), who.acting()
        )
    return api.ActionAccepted(
        id=str(pipeline_id),
        status=done.status.value,
        operation=done.operation,
        resumes_at=resume,
        links=links(str(pipeline_id)),
    )


@router.post(
    "/provider-callbacks/{stage}/{pipeline_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    tags=["providers"],
    responses={
        **LINK_ERRORS,
        429: {"model": api.Problem, "description": "more callbacks of the stage of the pipeline than it takes"},
    },
    dependencies=SIGNED_LINK,
)
def provider_callback(stage: events.Stage, pipeline_id: uuid.UUID, gw: GatewayDep) -> Response:
    """Where a stage's network provider (a music or render API) calls back when its work moves on.

    The stage polls the provider at once instead of at its next scheduled poll. A link the stage signed (no API
    key: providers cannot send one). The body is not read; the poll alone decides what became of the work. A link
    stays valid while the work may take, so one sent again and again is taken at most
    CASTAD_API_CALLBACK_BURST times at once and CASTAD_API_CALLBACKS_PER_S after, per pipeline and stage (429 with
    Retry-After beyond: the stage's scheduled polls go on regardless).
    """
    wait_s = gw.callbacks.take((pipeline_id, stage))
    if wait_s is not None:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"more callbacks of the {stage.value} stage of this pipeline than it takes: try again later",
            {"Retry-After": buckets.retry_after(wait_s)},
        )
    with db.transaction(gw.engine) as conn:
        operations.called_back(conn, pipeline_id, stage)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
