"""What every route gets: the gateway's parts, built once by the composition root, and who acts."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import sqlalchemy as sa
from castad_runtime import artifacts
from fastapi import Depends, Header, Request

from castad_api import notifications
from castad_api import settings as settings_


@dataclasses.dataclass
class Gateway:
    config: settings_.ApiSettings
    engine: sa.Engine
    notifications: notifications.PipelineNotifications
    store: artifacts.ArtifactStore


def gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[Gateway, Depends(gateway)]
Actor = Annotated[
    str,
    Header(
        alias="X-Castad-Actor",
        min_length=1,
        max_length=200,
        pattern=r"^[\x20-\x7e]+$",
        description="who acts (recorded with every operator action)",
    ),
]
