"""Event streams and the keys that hold them, on the gateway's HTTP API.

A revoked key's open streams end within seconds, a key holds at most its cap of streams at once (429 with
Retry-After beyond it), a stream resumed from far back replays only the newest entries, a pipeline's stream closes
after its lifetime and the command line's client follows it across the reconnections, and the gateway's one
listener wakes the streams of the pipeline a notification names (its sweep, those of a pipeline whose notification
was lost), and every stream when it loses or regains its database.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import httpx_sse
import pytest
import sqlalchemy as sa
from castad_api import keys, notifications, timeline_rows
from castad_cli import client as client_
from castad_contracts import events
from castad_runtime import db

from tests.integration.gateway import ago, make_key
from tests.support import waits

pytestmark = pytest.mark.integration
TENANT = (keys.Scope.SUBMIT, keys.Scope.READ)


class Stream:
    """An event stream read on a thread of its own until the gateway ends it."""

    def __init__(self, http: httpx.Client, path: str, last_event_id: str | None = None) -> None:
        self.ids: list[str] = []
        self.status: int | None = None
        self.ended_at: float | None = None
        self.opened = threading.Event()
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self._thread = threading.Thread(target=self._read, args=(http, path, headers), daemon=True)
        self._thread.start()
        assert self.opened.wait(10), path

    def _read(self, http: httpx.Client, path: str, headers: dict[str, str]) -> None:
        timeout = httpx.Timeout(10, read=30)
        try:
            with httpx_sse.connect_sse(http, "GET", path, headers=headers, timeout=timeout) as source:
                self.status = source.response.status_code
                self.opened.set()
                for sse in source.iter_sse():
                    if sse.data:
                        self.ids.append(sse.id)
        except httpx.HTTPError:
            pass
        finally:
            self.ended_at = time.monotonic()
            self.opened.set()

    def ended(self, within_s: float) -> bool:
        self._thread.join(within_s)
        return not self._thread.is_alive()


def opening(http: httpx.Client, path: str) -> httpx.Response:
    """The answer to a request for a stream, its body read only if it is not one (a stream is left at once)."""
    with http.stream("GET", path, timeout=10) as answer:
        if answer.status_code != 200:
            answer.read()
        return answer


@contextlib.contextmanager
def streams(http: httpx.Client, paths: list[str]) -> Iterator[list[Stream]]:
    opened = [Stream(http, path) for path in paths]
    try:
        yield opened
    finally:
        http.close()  # ends every stream still open


@pytest.mark.timeout(60)
def test_a_revoked_keys_open_streams_end_within_seconds(gateway, engines, api):
    engine = engines["api"]
    running = api(sse_key_check_s=0.5, sse_poll_s=0.2, sse_ping_s=0.5)
    key = make_key(engine, "ivy", *TENANT)
    pipeline_id = gateway.create(tenant="ivy")  # it never ends: its stream would stay open
    http = running.client(key)

    with streams(http, [f"/v1/pipelines/{pipeline_id}/events", "/v1/events"]) as opened:
        assert [stream.status for stream in opened] == [200, 200]
        time.sleep(1)
        assert not any(stream.ended(0) for stream in opened)  # open while the key is valid
        with db.transaction(engine) as conn:
            [row] = keys.listing(conn, "ivy")
            assert keys.revoke(conn, row.id)
        revoked_at = time.monotonic()

        assert all(stream.ended(10) for stream in opened)
        assert all(stream.ended_at is not None and stream.ended_at - revoked_at < 5 for stream in opened)


@pytest.mark.timeout(60)
def test_a_key_holds_at_most_its_cap_of_streams_and_then_gets_429_with_retry_after(gateway, engines, api):
    engine = engines["api"]
    running = api(sse_streams_per_key=2, sse_ping_s=0.5)
    key, other = make_key(engine, "jay", *TENANT), make_key(engine, "jay", *TENANT)
    pipeline_id = gateway.create(tenant="jay")
    path = f"/v1/pipelines/{pipeline_id}/events"

    with streams(running.client(key), [path, "/v1/events"]):
        refused = opening(running.client(key), path)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "2 event streams" in refused.json()["detail"]
        assert opening(running.client(key), "/v1/events").status_code == 429
        with streams(running.client(other), [path]) as others:  # another key of the tenant has its own
            assert others[0].status == 200
    # Closed streams give their places back (once the gateway sees they were closed).
    waits.until(lambda: opening(running.client(key), path).status_code == 200, timeout_s=10, what="a place given back")


@pytest.mark.timeout(60)
def test_a_stream_resumed_from_far_back_replays_only_the_newest_entries(gateway, engines, api):
    engine = engines["api"]
    running = api(sse_resume_max_entries=3, firehose_max_s=2, sse_poll_s=0.2)
    http = running.client(make_key(engine, "kim", *TENANT))

    with streams(running.client(make_key(engine, "kim", *TENANT)), ["/v1/events"]) as [live]:
        for n in range(6):
            gateway.create(f"Cafe {n}", tenant="kim")
        waits.until(lambda: len(live.ids) == 6, what="the six requests on the stream")
    oldest = live.ids[0]

    resumed = Stream(http, "/v1/events", last_event_id=oldest)
    assert resumed.ended(10)  # after its lifetime
    assert resumed.ids == live.ids[-3:]


@pytest.mark.timeout(60)
def test_a_pipelines_stream_closes_after_its_lifetime_and_the_cli_follows_it_to_the_end_across_reconnections(
    gateway, engines, api
):
    running = api(stream_max_s=0.5, sse_ping_s=0.2)
    key = make_key(engines["api"], "lee", *TENANT)
    pipeline_id = gateway.create(tenant="lee")
    path = f"/v1/pipelines/{pipeline_id}/events"

    alone = Stream(running.client(key), path)
    assert alone.ended(5) and alone.ids == ["1"]  # the request, then closed by its lifetime, the pipeline going on

    client = client_.Client(running.base_url, api_key=key)
    followed: list[tuple[str, str]] = []

    def follow() -> None:
        followed.extend((event_id, data["pipeline_status"]) for event_id, data in client.events(pipeline_id))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    start = ago(seconds=10)
    for stage in events.Stage:  # each applied after a stream or two closed and were opened again
        time.sleep(0.7)
        gateway.run(pipeline_id, stage, start, seconds=1)
    follower.join(10)
    client.close()

    assert not follower.is_alive()  # it ended with the pipeline
    ids = [event_id for event_id, _ in followed]
    assert ids == [str(n) for n in range(1, len(ids) + 1)] and len(ids) == 7  # each entry once, in order
    assert [status for _, status in followed][-1] == "SUCCEEDED"
    resumed = client_.Client(running.base_url, api_key=key)
    assert list(resumed.events(pipeline_id, last_event_id=ids[-1])) == []  # after its end: nothing, and it returns
    resumed.close()


@pytest.mark.timeout(60)
def test_the_listener_wakes_its_pipelines_streams_and_every_stream_when_it_loses_and_regains_its_database(
    engines, installation, gateway
):
    engine = engines["api"]
    pipeline_id = gateway.create(tenant="lee")

    def run(*statements: str, **values: str) -> None:
        with db.transaction(engine) as conn:
            for statement in statements:
                conn.execute(sa.text(statement), values)

    async def until(condition, what: str) -> None:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.05)
        assert condition(), what

    async def scenario() -> None:
        listener = notifications.PipelineNotifications(installation.database_urls["api"], sweep_s=0.3)
        listener.start()
        try:
            with listener.subscribe(pipeline_id) as mine, listener.subscribe(str(uuid.uuid4())) as other:
                await until(lambda: listener.listening, "listening")
                mine.clear(), other.clear()
                await asyncio.to_thread(
                    run,
                    "SELECT pg_notify(:channel, :id)",
                    channel=timeline_rows.PIPELINE_EVENTS_CHANNEL,
                    id=pipeline_id,
                )
                await until(mine.is_set, "the pipeline's stream woken")
                assert not other.is_set()

                # An entry whose notification was lost (written without its waker's wake-up): the sweep finds it.
                await asyncio.sleep(0.7)  # a sweep or two have marked the newest entry
                mine.clear()
                await asyncio.to_thread(
                    run,
                    "INSERT INTO pipeline_events (pipeline_id, event_id, event_type, data)"
                    " VALUES (:id, gen_random_uuid(), 'lyric.started', '{}')",
                    id=pipeline_id,
                )
                await until(mine.is_set, "the pipeline's stream woken by the sweep")
                assert not other.is_set()

                mine.clear()
                await asyncio.to_thread(
                    run,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'",
                )
                await until(lambda: mine.is_set() and other.is_set() and not listener.listening, "woken: not listening")
                mine.clear(), other.clear()
                await until(lambda: listener.listening and mine.is_set() and other.is_set(), "woken: listening again")
        finally:
            await listener.stop()

    asyncio.run(scenario())
