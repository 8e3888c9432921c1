"""A tenant's brand kit (brands.py): its logo, colours, font and caption style, which its briefs use."""

from __future__ import annotations

from castad_contracts import api
from castad_runtime import db
from fastapi import APIRouter, HTTPException, Response, status

from castad_api import brands, deps
from castad_api.deps import GatewayDep, Reader, Submitter

router = APIRouter(prefix="/v1", tags=["brand"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})


@router.get("/brand", response_model=api.BrandKit, responses={404: {"model": api.Problem}})
def get_brand(gw: GatewayDep, who: Reader) -> api.BrandKit:
    """The tenant's brand kit as set last; 404 when it set none."""
    with gw.engine.connect() as conn:
        found = brands.kit(conn, who.tenant)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "this tenant has set no brand kit (PUT /v1/brand)")
    return brands.view(found)


@router.put("/brand", response_model=api.BrandKit, dependencies=[deps.SUBMIT_ONLY])
def put_brand(body: api.BrandKitRequest, gw: GatewayDep, who: Submitter) -> api.BrandKit:
    """Set the tenant's brand kit: every pipeline made from now on uses it unless its brief asks for none.

    A pipeline made before keeps the kit it began with. 422 for a logo that is not an image the tenant uploaded."""
    with db.transaction(gw.engine) as conn:
        return brands.view(brands.save(conn, who.tenant, body, who.key_id))


@router.delete("/brand", status_code=status.HTTP_204_NO_CONTENT, responses={404: {"model": api.Problem}})
def delete_brand(gw: GatewayDep, who: Submitter) -> Response:
    """Remove the tenant's brand kit: pipelines made from now on have none. 404 when it set none."""
    with db.transaction(gw.engine) as conn:
        if not brands.delete(conn, who.tenant):
            raise HTTPException(status.HTTP_404_NOT_FOUND, "this tenant has set no brand kit")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
