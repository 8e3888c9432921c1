"""What every route gets: the gateway's parts, built once by the composition root, and who calls.

Every route but the probes, `/metrics`, the providers' callbacks and the console's static files
(routes/console.py) needs an API key (`Authorization: Bearer <key>`, see keys.py) with the route's
scope (GET /v1/me: any): none or a wrong one is a 401, a missing scope a 403, and a client address
that failed too often a 429 (auth.py). A key sees only its tenant's pipelines (an admin key every
tenant's); another tenant's pipeline is a 404, as if it did not exist.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Annotated, Any

import sqlalchemy as sa
from castad_contracts import api
from castad_runtime import artifacts, health
from fastapi import Depends, Header, HTTPException, Request, status
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from castad_api import auth, buckets, decoding, disclosure, keyring, keys, notifications, served, stream_keys
from castad_api import metrics as metrics_
from castad_api import settings as settings_

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Gateway:
    config: settings_.ApiSettings
    engine: sa.Engine
    notifications: notifications.PipelineNotifications
    store: artifacts.ArtifactStore
    metrics: metrics_.GatewayMetrics = dataclasses.field(default_factory=metrics_.GatewayMetrics)
    decoding: decoding.Decoding = dataclasses.field(default_factory=decoding.Decoding)
    auth: auth.Authenticator = dataclasses.field(init=False)
    broker_check: health.KeptBroker = dataclasses.field(init=False)
    stream_keys: stream_keys.StreamKeys = dataclasses.field(init=False)
    keyring: keyring.Keyring = dataclasses.field(init=False)
    readiness: dict[str, health.Check] = dataclasses.field(init=False)
    seals: served.Seals = dataclasses.field(default_factory=served.Seals)
    callbacks: buckets.Buckets = dataclasses.field(init=False)  # providers' callbacks, per pipeline and stage

    def __post_init__(self) -> None:
        limit = auth.FailureLimit(self.config.auth_failure_burst, self.config.auth_failures_per_s)
        self.auth = auth.Authenticator(limit, lambda failure: self.metrics.auth_failures.labels(failure.value).inc())
        self.callbacks = buckets.Buckets(self.config.callback_burst, self.config.callbacks_per_s)
        config = self.config
        self.keyring = keyring.Keyring(self.engine)
        self.stream_keys = stream_keys.StreamKeys(self.engine, config.sse_streams_per_key, config.sse_key_check_s)
        # Readiness on connections kept for it (the pool's, one to the broker), read at most every CACHE_S.
        self.broker_check = health.KeptBroker(self.config.amqp_url)
        self.readiness = {
            "database": health.cached(health.pooled_database(self.engine)),
            "rabbitmq": health.cached(self.broker_check),
        }

    def file(self, where: pathlib.Path | str, recorded: served.Recorded, media_type: str, name: str) -> Response:
        """A stored file as its record describes it (`served.file`).

        500 with the reason and none of its bytes if it is not; 404 if it is gone.
        """
        try:
            return served.file(where, recorded, media_type, name, self.seals, self._corrupt)
        except served.Corrupt:
            raise HTTPException(
                status.HTTP_500_INTERNAL_SERVER_ERROR,
                "the stored file is not the one on record, so it is not served; the operators were told",
            ) from None
        except artifacts.ArtifactMissing:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "the file is not in this store") from None

    def _corrupt(self, corrupt: served.Corrupt) -> None:
        log.error("integrity: %s", corrupt)
        self.metrics.integrity_failures.inc()

    def viewer(self, who: keys.Principal) -> disclosure.Viewer:
        """What `who` is shown of the gateway's internals (all of it for an admin key)."""
        return disclosure.Viewer(who.tenant_filter(), self.keyring)


async def gateway(request: Request) -> Gateway:
    """The gateway's parts.

    Async though it waits for nothing: FastAPI runs a plain function dependency on a thread of its pool, a hop that
    costs more than this takes.
    """
    gw: Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[Gateway, Depends(gateway)]
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": api.Problem, "description": "no API key, or an unknown or revoked one"},
    403: {"model": api.Problem, "description": "the API key lacks the scope"},
    429: {
        "model": api.Problem,
        "description": "an authentication failed, one too many from this client address (IPv6: its /64), or a key"
        " this gateway process has not seen valid lately came from such an address past its look-ups: try again"
        " after Retry-After",
    },
}
UNREADABLE: dict[int | str, dict[str, Any]] = {400: {"model": api.Problem, "description": "a body that is not JSON"}}
_bearer = HTTPBearer(auto_error=False, description="an API key (castad-admin keys create)")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _caller(scope: keys.Scope | None) -> Any:
    """The caller of a route needing a valid key with `scope` (None: any valid key)."""

    def authorize(
        gw: GatewayDep,
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> keys.Principal:
        address = request.client.host if request.client is not None else "unknown"
        try:
            token = credentials.credentials if credentials is not None else None
            principal = gw.auth.authenticate(gw.engine, token, address)
        except auth.Refused as refused:
            raise _refusal(refused) from None
        if scope is not None and not principal.may(scope):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"the API key lacks the scope {scope.value!r}")
        return principal

    return Depends(authorize)


def _refusal(refused: auth.Refused) -> HTTPException:
    if refused.failure is auth.Failure.THROTTLED:
        return HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "authentication failed, and too many have from this address: try again later",
            {"Retry-After": refused.retry_after()},
        )
    if refused.failure is auth.Failure.MISSING:
        return HTTPException(
            status.HTTP_401_UNAUTHORIZED, "an API key is needed: Authorization: Bearer <key>", _CHALLENGE
        )
    return HTTPException(status.HTTP_401_UNAUTHORIZED, "the API key is unknown or revoked", _CHALLENGE)


Caller = Annotated[keys.Principal, _caller(None)]
SUBMIT_ONLY = _caller(keys.Scope.SUBMIT)  # also in a route's dependencies: the key is checked before the body
Submitter = Annotated[keys.Principal, SUBMIT_ONLY]
Reader = Annotated[keys.Principal, _caller(keys.Scope.READ)]
Operator = Annotated[keys.Principal, _caller(keys.Scope.OPERATE)]
ADMIN_ONLY = _caller(keys.Scope.ADMIN)  # for a whole router
Admin = Annotated[keys.Principal, ADMIN_ONLY]  # the same dependency: the key is read once
Actor = Annotated[
    str,
    Header(
        alias="X-Castad-Actor",
        min_length=1,
        max_length=200,
        pattern=r"^[\x20-\x7e]+$",
        description="who acts (recorded with every operator action, beside the id and name of the API key that acts)",
    ),
]
