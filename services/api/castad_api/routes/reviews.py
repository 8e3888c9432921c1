"""A pipeline's review: its current draft, and a decision on it, by API key or by its notice's signed link.

How a review goes, from the brief to the stage and back: reviews.py (the gateway's part) and
castad_runtime.stage.reviews (the stage's).
"""

from __future__ import annotations

import uuid

from castad_contracts import api
from castad_runtime import db
from fastapi import APIRouter, Depends, HTTPException, status

from castad_api import decisions, deps, errors, keys, repository, reviews
from castad_api.deps import Gateway, GatewayDep, Reader, Submitter
from castad_api.routes import common

router = APIRouter(prefix="/v1", tags=["reviews"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})
DECISION_ERRORS: dict[int | str, dict[str, object]] = {
    404: {"model": api.Problem},
    413: {"model": api.Problem},
    415: {"model": api.Problem},
    409: {
        "model": api.Conflict,
        "description": "the draft is not the pipeline's current one, was decided already or timed out, the pipeline"
        " no longer waits for a review, or a regenerate asks for more new drafts than a review allows",
    },
}


def _review(gw: Gateway, pipeline_id: uuid.UUID, tenant: str | None) -> api.ReviewView:
    with gw.engine.connect() as conn:
        row = repository.get_pipeline(conn, pipeline_id, tenant)
        if row is None:
            raise errors.NotFound(f"no pipeline {pipeline_id}")
        shown = reviews.view(row, reviews.current(conn, [pipeline_id]).get(pipeline_id))
    if shown is None:
        raise errors.NotFound(f"pipeline {pipeline_id} asked for no review")
    return shown


def _decide(
    gw: Gateway, pipeline_id: uuid.UUID, body: api.ReviewDecision, who: keys.Principal | None
) -> api.ReviewAccepted:
    with db.transaction(gw.engine) as conn:
        now = decisions.decide(
            conn, pipeline_id, body, who.tenant_filter() if who else None, who.acting() if who else None
        )
    pid = str(pipeline_id)
    return api.ReviewAccepted(
        id=pid, draft=body.draft, decision=body.decision, status=now.value, links=common.links(pid)
    )


@router.get("/pipelines/{pipeline_id}/review", response_model=api.ReviewView, responses={404: {"model": api.Problem}})
def get_review(pipeline_id: uuid.UUID, gw: GatewayDep, who: Reader) -> api.ReviewView:
    """The review the pipeline asked for and its current draft: its text, until when it waits, what became of it."""
    return _review(gw, pipeline_id, who.tenant_filter())


@router.post(
    "/pipelines/{pipeline_id}/review",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.ReviewAccepted,
    dependencies=[deps.SUBMIT_ONLY, Depends(common.require_json)],
    responses=DECISION_ERRORS,
)
def decide(pipeline_id: uuid.UUID, body: api.ReviewDecision, gw: GatewayDep, who: Submitter) -> api.ReviewAccepted:
    """Decide on the pipeline's current draft: approve it, edit it, or ask for a new one.

    Recorded with the acting key and carried to the stage that drafted, which applies it once. An edit's lyrics are
    sung exactly as written. Only the current draft, and only once: any other, or a second decision, is 409.
    """
    return _decide(gw, pipeline_id, body, who)


@router.get(
    "/links/pipelines/{pipeline_id}/review/{draft_id}",
    response_model=api.ReviewView,
    dependencies=common.SIGNED_LINK,
    responses={**common.LINK_ERRORS, 410: {"model": api.Problem}},
)
def linked_review(pipeline_id: uuid.UUID, draft_id: uuid.UUID, gw: GatewayDep) -> api.ReviewView:
    """The review of a `review.requested` notice's link, without an API key: 410 once a new draft replaced its own."""
    shown = _review(gw, pipeline_id, None)
    if shown.draft is None or shown.draft.id != str(draft_id):
        raise HTTPException(status.HTTP_410_GONE, f"draft {draft_id} was replaced by a new draft")
    return shown


@router.post(
    "/links/pipelines/{pipeline_id}/review/{draft_id}",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.ReviewAccepted,
    dependencies=[*common.SIGNED_LINK, Depends(common.require_json)],
    responses={**common.LINK_ERRORS, **DECISION_ERRORS},
)
def linked_decide(
    pipeline_id: uuid.UUID, draft_id: uuid.UUID, body: api.ReviewChoice, gw: GatewayDep
) -> api.ReviewAccepted:
    """Decide on the draft the link names, without an API key, as `POST /v1/pipelines/{id}/review` does.

    Recorded as decided through the link (no key). Until the draft's review times out.
    """
    decision = api.ReviewDecision(draft=str(draft_id), **body.model_dump())
    return _decide(gw, pipeline_id, decision, None)
