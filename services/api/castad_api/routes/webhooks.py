"""The notices a pipeline's end sent to the brief's callback_url, with every try."""

from __future__ import annotations

import dataclasses
import uuid

from castad_contracts import api
from fastapi import APIRouter

from castad_api import (
    deps,
    webhooks,
)
from castad_api.deps import GatewayDep, Reader
from castad_api.routes import pipeline_views

router = APIRouter(prefix="/v1", tags=["pipelines"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})


@router.get(
    "/pipelines/{pipeline_id}/webhooks",
    response_model=list[api.WebhookDelivery],
    responses={404: {"model": api.Problem}},
)
def pipeline_webhooks(pipeline_id: uuid.UUID, gw: GatewayDep, who: Reader) -> list[api.WebhookDelivery]:
    """The notices sent to the brief's callback_url when the pipeline ended (once per ending), with every try."""
    pipeline_views.load(gw, pipeline_id, who)
    with gw.engine.connect() as conn:
        found = webhooks.deliveries(conn, pipeline_id)
    return [api.WebhookDelivery.model_validate({**dataclasses.asdict(d), "id": str(d.id)}) for d in found]
