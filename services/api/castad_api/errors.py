"""What a gateway use case refuses; the HTTP layer maps each to its status in one place."""

from __future__ import annotations

import datetime as dt

from fastapi.exceptions import RequestValidationError


class GatewayError(Exception):
    """A request the gateway refuses."""


class NotFound(GatewayError):
    """No such pipeline or dead letter (404)."""


class Conflict(GatewayError):
    """The pipeline's state does not allow the action (409); `status` says what it is."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class Full(GatewayError):
    """The tenant holds as many images, or as many bytes of them, as it may (409): nothing was stored."""


class OverBudget(GatewayError):
    """A creation past a budget of the tenant (usage.py): 429 for its pipelines, 402 for its seconds or its cost."""

    def __init__(self, message: str, resets_at: dt.datetime, payment: bool) -> None:
        super().__init__(message)
        self.resets_at = resets_at
        self.payment = payment


class NotReplayable(GatewayError):
    """A dead letter that cannot be sent again as it is (422)."""


class BadWindow(GatewayError):
    """A window of the statistics that is not a duration they take (422 naming the field)."""


class InvalidField(GatewayError):
    """A field of the request that names what cannot be used, e.g. a photo that is not the tenant's (422)."""

    def __init__(self, loc: tuple[str | int, ...], message: str, given: object = None) -> None:
        super().__init__(message)
        self.loc = loc
        self.given = given


def invalid(loc: tuple[str | int, ...], message: str, given: object = None) -> RequestValidationError:
    """A 422 in the shape of every other (FastAPI's validation error): where, and why."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error", "input": given}])
