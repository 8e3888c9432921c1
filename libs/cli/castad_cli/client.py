"""A small client of the gateway's REST API and event stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import httpx_sse
from castad_contracts import api, brief


class GatewayError(Exception):
    """The gateway answered with an error; the message carries its detail."""


class Client:
    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def submit(self, body: brief.Brief, idempotency_key: str | None = None) -> api.PipelineAccepted:
        response = self.http.post(
            "/v1/pipelines",
            content=body.model_dump_json(),
            headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key or str(uuid.uuid4())},
        )
        return api.PipelineAccepted.model_validate(_ok(response))

    def status(self, pipeline_id: str) -> api.PipelineView:
        return api.PipelineView.model_validate(_ok(self.http.get(f"/v1/pipelines/{pipeline_id}")))

    def events(self, pipeline_id: str, last_event_id: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event id, data) of each progress event until the stream closes at a terminal state."""
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        with httpx_sse.connect_sse(
            self.http, "GET", f"/v1/pipelines/{pipeline_id}/events", headers=headers, timeout=None
        ) as source:
            if source.response.status_code != 200:
                source.response.read()
                _ok(source.response)
            for sse in source.iter_sse():
                if sse.data:
                    yield sse.id, json.loads(sse.data)


def _ok(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    raise GatewayError(f"{response.status_code}: {detail}")
