"""What the API's bodies share: a resource's links, a refusal's body, the calling key, a reason and a filter."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StringConstraints

from castad_contracts import brief


class Links(BaseModel):
    self: str
    events: str
    cancel: str
    retry: str


class Problem(BaseModel):
    detail: str


class Caller(BaseModel):
    """The API key that calls: whose it is and what it may do."""

    key_id: str
    tenant: str
    name: str = Field(description="what the key is for, as its maker said")
    scopes: list[str] = Field(description="submit, read, operate, admin (admin may do everything)")


class Conflict(BaseModel):
    detail: str
    status: str = Field(description="the state that does not allow the action")


Reason = Annotated[str, StringConstraints(min_length=1, max_length=500), AfterValidator(brief.no_control_characters)]
Filter = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(brief.no_control_characters)]
