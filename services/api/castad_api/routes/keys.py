"""The key that calls: its tenant, name and scopes, so that a client (the console) shows only what it may do."""

from __future__ import annotations

from castad_contracts import api
from fastapi import APIRouter

from castad_api import deps

router = APIRouter(prefix="/v1", tags=["keys"], responses=deps.AUTH_ERRORS)


@router.get("/me", response_model=api.Caller)
def me(who: deps.Caller) -> api.Caller:
    """The calling key's tenant, name and scopes. Any valid key may ask, whatever its scopes."""
    scopes = sorted(scope.value for scope in who.scopes)
    return api.Caller(key_id=str(who.key_id), tenant=who.tenant, name=who.name, scopes=scopes)
