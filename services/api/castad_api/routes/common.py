"""What several route modules share: a JSON body's check, a pipeline's links, links signed for providers."""

from __future__ import annotations

from typing import Annotated, Any

from castad_contracts import api
from castad_runtime import links as signed_links
from fastapi import Depends, HTTPException, Query, Request, status

from castad_api.deps import GatewayDep


async def require_json(request: Request) -> None:  # async: no thread of FastAPI's pool for a header's check
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json")


def links(pipeline_id: str) -> api.Links:
    base = f"/v1/pipelines/{pipeline_id}"
    return api.Links(self=base, events=f"{base}/events", cancel=f"{base}/cancel", retry=f"{base}/retry")


Expires = Annotated[int, Query(ge=0, le=2**40, description="when the link expires (Unix seconds)")]
Signature = Annotated[str, Query(pattern=r"^[0-9a-f]{64}$", description="the link's HMAC-SHA256")]


def check_link(gw: GatewayDep, request: Request, expires: Expires, signature: Signature) -> None:
    """Check a link signed for a provider by the stage that signs links to this path.

    The link (castad_runtime.links) must be for this very path and its purpose, not expired and not valid for
    longer than CASTAD_API_LINK_MAX_S.
    """
    root = gw.config.link_secret
    if root is None or not signed_links.accepted(
        root, request.url.path, expires, signature, max_s=gw.config.link_max_s
    ):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "the link is not valid (altered, expired, too long-lived or not signed here)"
        )


SIGNED_LINK = [Depends(check_link)]
LINK_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": api.Problem}, 404: {"model": api.Problem}}
