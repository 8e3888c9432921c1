"""A small client of the gateway's REST API and event stream."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import httpx_sse
from castad_contracts import api, brief, events


class GatewayError(Exception):
    """The gateway answered with an error, or could not be reached; `status` is its HTTP status (None: unreached)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(
        self, base_url: str, timeout_s: float = 10.0, actor: str = "castad-cli", api_key: str | None = None
    ) -> None:
        self.base_url = base_url
        headers = {"X-Castad-Actor": actor, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self.http.close()

    def submit(
        self, body: brief.Brief | api.PipelineRequest, idempotency_key: str | None = None
    ) -> api.PipelineAccepted:
        """Submit a brief (a PipelineRequest names photos by uploaded image id or URL).

        What it does not say is left out (a null, formats not asked for), so that a gateway of a release before
        that knew no such field takes it."""
        headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        return api.PipelineAccepted.model_validate(
            self._call("POST", "/v1/pipelines", content=body.model_dump_json(exclude_none=True), headers=headers)
        )

    def upload_image(self, name: str, data: bytes) -> api.Image:
        """Upload an image for briefs to name.

        The gateway tells its type by decoding it, and refuses what it is not (422 with the reason).
        """
        files = {"file": (name, data, "application/octet-stream")}
        return api.Image.model_validate(
            self._call("POST", "/v1/images", files=files, timeout=httpx.Timeout(10, read=120))
        )

    def status(self, pipeline_id: str) -> api.PipelineView:
        return api.PipelineView.model_validate(self._call("GET", f"/v1/pipelines/{pipeline_id}"))

    def timeline(self, pipeline_id: str) -> api.PipelineTimeline:
        """The whole timeline: every page of its entries."""
        shown = api.PipelineTimeline.model_validate(self._call("GET", f"/v1/pipelines/{pipeline_id}/timeline"))
        while shown.next_after is not None:
            params = {"after": shown.next_after}
            page = api.PipelineTimeline.model_validate(
                self._call("GET", f"/v1/pipelines/{pipeline_id}/timeline", params=params)
            )
            shown = page.model_copy(update={"entries": [*shown.entries, *page.entries]})
        return shown

    def stats(self, window: str) -> api.Stats:
        return api.Stats.model_validate(self._call("GET", "/v1/stats", params={"window": window}))

    def usage(self, first: dt.date | None = None, last: dt.date | None = None, tenant: str | None = None) -> api.Usage:
        """What the key's tenant used per day (an admin key: every tenant's, or `tenant`'s), with its budgets."""
        asked = {"from": first, "to": last, "tenant": tenant}
        params = {name: str(value) for name, value in asked.items() if value is not None}
        return api.Usage.model_validate(self._call("GET", "/v1/usage", params=params))

    def cancel(self, pipeline_id: str, reason: str | None = None) -> api.ActionAccepted:
        body = api.CancelRequest(reason=reason) if reason else api.CancelRequest()
        return api.ActionAccepted.model_validate(
            self._call("POST", f"/v1/pipelines/{pipeline_id}/cancel", json=body.model_dump())
        )

    def retry(self, pipeline_id: str, max_attempts: dict[events.Stage, int] | None = None) -> api.ActionAccepted:
        body = api.RetryRequest(max_attempts=max_attempts)
        return api.ActionAccepted.model_validate(
            self._call("POST", f"/v1/pipelines/{pipeline_id}/retry", json=body.model_dump(mode="json"))
        )

    def remake(
        self, pipeline_id: str, body: api.RemakeRequest, idempotency_key: str | None = None
    ) -> api.PipelineAccepted:
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        sent = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return api.PipelineAccepted.model_validate(
            self._call("POST", f"/v1/pipelines/{pipeline_id}/remake", json=sent, headers=headers)
        )

    def review(self, pipeline_id: str) -> api.ReviewView:
        return api.ReviewView.model_validate(self._call("GET", f"/v1/pipelines/{pipeline_id}/review"))

    def decide(self, pipeline_id: str, decision: api.ReviewDecision) -> api.ReviewAccepted:
        body = decision.model_dump(exclude_none=True)
        return api.ReviewAccepted.model_validate(self._call("POST", f"/v1/pipelines/{pipeline_id}/review", json=body))

    def brand(self) -> api.BrandKit:
        return api.BrandKit.model_validate(self._call("GET", "/v1/brand"))

    def set_brand(self, kit: api.BrandKitRequest) -> api.BrandKit:
        return api.BrandKit.model_validate(self._call("PUT", "/v1/brand", json=kit.model_dump(mode="json")))

    def clear_brand(self) -> None:
        self._call("DELETE", "/v1/brand")

    def dead_letters(self, **filters: Any) -> api.DeadLetterPage:
        params = {key: value for key, value in filters.items() if value is not None}
        return api.DeadLetterPage.model_validate(self._call("GET", "/v1/dead-letters", params=params))

    def dead_letter(self, letter_id: int) -> api.DeadLetterDetail:
        return api.DeadLetterDetail.model_validate(self._call("GET", f"/v1/dead-letters/{letter_id}"))

    def replay(self, letter_id: int) -> api.Replayed:
        return api.Replayed.model_validate(self._call("POST", f"/v1/dead-letters/{letter_id}/replay"))

    def replay_matching(self, selection: api.DeadLetterFilter) -> api.BulkReplayed:
        return api.BulkReplayed.model_validate(
            self._call("POST", "/v1/dead-letters/replay", json=selection.model_dump(exclude_none=True))
        )

    def discard(self, letter_id: int, reason: str) -> api.DeadLetter:
        return api.DeadLetter.model_validate(
            self._call("POST", f"/v1/dead-letters/{letter_id}/discard", json={"reason": reason})
        )

    def download(self, path: str, dest: pathlib.Path) -> int:
        """Save a file the gateway serves (following its redirect to an object store); its size."""
        try:
            with self.http.stream("GET", path, follow_redirects=True, timeout=httpx.Timeout(30, read=300)) as got:
                if not got.is_success:
                    got.read()
                    _ok(got)
                size = 0
                with dest.open("wb") as out:
                    for chunk in got.iter_bytes():
                        size += out.write(chunk)
                return size
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from None

    def events(self, pipeline_id: str, last_event_id: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event id, data) of each progress event, until the stream closes after the pipeline ended.

        The gateway closes a stream that has lasted CASTAD_API_STREAM_MAX_S, or when it stops: the stream is opened
        again after the last event seen (Last-Event-ID), so that nothing is missed or seen twice. A stream that
        closes with nothing new while the pipeline has ended (it was followed from after its last event) ends it.
        """
        while True:
            received = ended = False
            for event_id, data in self._stream(pipeline_id, last_event_id):
                received, last_event_id = True, event_id or last_event_id
                ended = data.get("pipeline_status") in api.ENDED
                yield event_id, data
            if ended or (not received and self.status(pipeline_id).status in api.ENDED):
                return

    def _stream(self, pipeline_id: str, last_event_id: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        try:
            with httpx_sse.connect_sse(
                self.http, "GET", f"/v1/pipelines/{pipeline_id}/events", headers=headers, timeout=None
            ) as source:
                if source.response.status_code != 200:
                    source.response.read()
                    _ok(source.response)
                for sse in source.iter_sse():
                    if sse.data:
                        yield sse.id, json.loads(sse.data)
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from None

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from None
        return _ok(response)


def _unreachable(base_url: str, error: httpx.TransportError) -> GatewayError:
    return GatewayError(f"cannot reach the gateway at {base_url} ({type(error).__name__})", None)


def _ok(response: httpx.Response) -> Any:
    if response.status_code == 204:
        return None
    if response.is_success:
        return response.json()
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text.strip()[:200]}
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    raise GatewayError(f"{response.status_code}: {detail}", response.status_code)
