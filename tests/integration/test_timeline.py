"""A pipeline's timeline and the stream of every pipeline's entries, on a real PostgreSQL.

From the gateway's projection: events applied as its consumer applies them, read through its HTTP API.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid

import httpx
import httpx_sse
import pytest
import sqlalchemy as sa
from castad_api import disclosure, keyring, keys, listing, model, projection, repository, timeline, timeline_rows
from castad_api.routes import timeline as timeline_routes
from castad_contracts import envelope, events
from castad_faults import outage
from castad_runtime import db
from opentelemetry.sdk.trace import TracerProvider

from tests.integration.gateway import ago, make_key
from tests.support import waits
from tests.support.installation import TEST_KEY_TENANT

pytestmark = pytest.mark.integration
LYRIC, SONG, VIDEO = events.STAGE_ORDER
JAEGER = "http://127.0.0.1:16686/trace/{trace_id}"


def test_the_timeline_tells_every_event_in_order_each_attempt_and_the_operators_cancel(gateway, api, installation):
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("submit") as span:
        pipeline_id = gateway.create()
    trace_id = format(span.get_span_context().trace_id, "032x")
    t0 = ago(minutes=10)

    def at(seconds: float) -> dt.datetime:
        return t0 + dt.timedelta(seconds=seconds)

    gateway.event(pipeline_id, LYRIC, "started", 1, at(0), worker="lyric@a:1")
    gateway.event(pipeline_id, LYRIC, "retrying", 1, at(4), code="provider_error")
    gateway.event(pipeline_id, LYRIC, "started", 2, at(5), worker="lyric@b:2")
    gateway.event(pipeline_id, LYRIC, "retrying", 2, at(8), code="worker_stopped")  # handed back
    gateway.event(pipeline_id, LYRIC, "started", 3, at(9), worker="lyric@a:1")
    gateway.event(pipeline_id, LYRIC, "completed", 3, at(19))
    gateway.event(pipeline_id, SONG, "started", 1, at(20), worker="song@c:3")
    operation = gateway.cancel(pipeline_id, actor="ops", reason="the customer withdrew")
    # The request and the cancel as if made then, among the stages' events.
    gateway.backdate(pipeline_id, "pipeline.requested", at(-1))
    gateway.backdate(pipeline_id, "pipeline.cancel_requested", at(22))
    gateway.event(pipeline_id, SONG, "canceled", 1, at(26), operation=operation)
    gateway.event(pipeline_id, VIDEO, "canceled", 0, at(26), operation=operation)

    http = api(trace_url=JAEGER).client(installation.api_key)
    answer = http.get(f"/v1/pipelines/{pipeline_id}/timeline")

    assert answer.status_code == 200, answer.text
    shown = answer.json()
    assert (shown["id"], shown["status"], shown["trace_id"]) == (pipeline_id, "CANCELED", trace_id)
    assert shown["trace_url"] == f"http://127.0.0.1:16686/trace/{trace_id}"
    entries = shown["entries"]
    assert [(e["event_type"], e["attempt"]) for e in entries] == [
        ("pipeline.requested", None),
        ("lyric.started", 1),
        ("lyric.retrying", 1),
        ("lyric.started", 2),
        ("lyric.retrying", 2),
        ("lyric.started", 3),
        ("lyric.completed", 3),
        ("song.started", 1),
        ("pipeline.cancel_requested", None),
        ("song.canceled", 1),
        ("video.canceled", 0),
    ]
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)
    times = [dt.datetime.fromisoformat(e["time"]) for e in entries]
    assert times == [at(s) for s in (-1, 0, 4, 5, 8, 9, 19, 20, 22, 26, 26)]  # each event's own time
    assert [e["worker"] for e in entries if e["status"] == "started"] == [
        "lyric@a:1",
        "lyric@b:2",
        "lyric@a:1",
        "song@c:3",
    ]
    assert entries[2]["error"] == {"code": "provider_error", "message": "provider_error on attempt 1"}
    assert entries[6]["artifact"]["download"] == f"/v1/pipelines/{pipeline_id}/artifacts/lyric"
    assert (entries[8]["actor"], entries[8]["reason"], entries[8]["operation"]) == ("ops", "the customer withdrew", 1)
    assert entries[-1]["pipeline_status"] == "CANCELED"

    attempts = [
        (a["stage"], a["attempt"], a["worker"], a["duration_s"], a["outcome"], a["error_code"])
        for a in shown["attempts"]
    ]
    assert attempts == [
        ("lyric", 1, "lyric@a:1", 4.0, "failed_retryable", "provider_error"),
        ("lyric", 2, "lyric@b:2", 3.0, "interrupted", "worker_stopped"),
        ("lyric", 3, "lyric@a:1", 10.0, "succeeded", None),
        ("song", 1, "song@c:3", 6.0, "canceled", "canceled"),
    ]
    [action] = shown["actions"]
    assert (action["action"], action["actor"], action["reason"], action["seq"]) == (
        "cancel_requested",
        "ops",
        "the customer withdrew",
        entries[8]["seq"],
    )

    # In pages: `next_after` until the last one.
    first = http.get(f"/v1/pipelines/{pipeline_id}/timeline", params={"limit": 4}).json()
    assert [e["seq"] for e in first["entries"]] == [e["seq"] for e in entries[:4]]
    assert first["next_after"] == entries[3]["seq"] and first["attempts"] == shown["attempts"]
    rest = http.get(f"/v1/pipelines/{pipeline_id}/timeline", params={"after": first["next_after"]}).json()
    assert [e["seq"] for e in rest["entries"]] == [e["seq"] for e in entries[4:]] and rest["next_after"] is None

    # Without a trace viewer configured: the trace id, no link.
    plain = api().client(installation.api_key).get(f"/v1/pipelines/{pipeline_id}/timeline").json()
    assert (plain["trace_id"], plain["trace_url"]) == (trace_id, None)


def attempts_of(engine: sa.Engine, pipeline_id: str) -> dict[tuple[str, int], tuple]:
    with engine.connect() as conn:
        rows = repository.pipeline_attempts(conn, uuid.UUID(pipeline_id))
    return {(r.stage, r.attempt): (r.worker, r.started_at, r.ended_at, r.outcome, r.error_code) for r in rows}


def test_entries_are_shown_by_when_they_happened_whichever_the_gateway_learned_first(gateway, api, installation):
    pipeline_id = gateway.create()
    t0 = ago(minutes=1)
    gateway.backdate(pipeline_id, "pipeline.requested", t0)
    gateway.event(pipeline_id, LYRIC, "started", 1, t0 + dt.timedelta(seconds=1))
    # The song's start overtook the lyrics' end on its way to the gateway.
    gateway.event(pipeline_id, SONG, "started", 1, t0 + dt.timedelta(seconds=3))
    gateway.event(pipeline_id, LYRIC, "completed", 1, t0 + dt.timedelta(seconds=2))
    http = api().client(installation.api_key)

    entries = http.get(f"/v1/pipelines/{pipeline_id}/timeline").json()["entries"]
    shown = [e["event_type"] for e in entries]
    assert shown == ["pipeline.requested", "lyric.started", "lyric.completed", "song.started"]
    # Pages go by seq, each shown by time: every entry once, the page's highest seq to go on after.
    first = http.get(f"/v1/pipelines/{pipeline_id}/timeline", params={"limit": 3}).json()
    assert [e["event_type"] for e in first["entries"]] == ["pipeline.requested", "lyric.started", "song.started"]
    assert first["next_after"] == max(e["seq"] for e in first["entries"])
    rest = http.get(f"/v1/pipelines/{pipeline_id}/timeline", params={"after": first["next_after"]}).json()
    assert [e["event_type"] for e in rest["entries"]] == ["lyric.completed"] and rest["next_after"] is None


def test_a_failure_that_overtook_the_completion_before_it_ends_the_pipeline_only_once_that_is_in(
    gateway, api, installation, engines
):
    pipeline_id = gateway.create(callback_url="https://hooks.example.com/castad")
    t0 = ago(minutes=1)
    gateway.event(pipeline_id, LYRIC, "started", 1, t0)
    # The song's start and its failure both overtook the lyrics' end on their way to the gateway.
    gateway.event(pipeline_id, SONG, "started", 1, t0 + dt.timedelta(seconds=3))
    gateway.event(pipeline_id, SONG, "failed", 1, t0 + dt.timedelta(seconds=4), code="injected_fault")
    http = api().client(installation.api_key)

    def deliveries() -> list[dict]:
        with engines["api"].connect() as conn:
            rows = conn.execute(
                sa.text("SELECT payload FROM webhook_deliveries WHERE pipeline_id = :id"), {"id": pipeline_id}
            )
            return [row.payload for row in rows]

    view = http.get(f"/v1/pipelines/{pipeline_id}").json()
    assert (view["status"], view["finished_at"]) == ("RUNNING", None) and deliveries() == []

    gateway.event(pipeline_id, LYRIC, "completed", 1, t0 + dt.timedelta(seconds=2))

    view = http.get(f"/v1/pipelines/{pipeline_id}").json()
    assert (view["status"], view["error_code"]) == ("FAILED", "injected_fault") and view["finished_at"]
    entries = http.get(f"/v1/pipelines/{pipeline_id}/timeline").json()["entries"]
    by_seq = sorted(entries, key=lambda e: e["seq"])
    assert [e["pipeline_status"] for e in by_seq] == ["PENDING", "RUNNING", "RUNNING", "RUNNING", "FAILED"]
    end = by_seq[-1]  # what a stream shows last: the lyrics' end, which ends the pipeline, with its error
    assert end["event_type"] == "lyric.completed"
    assert end["error"] == {"code": "injected_fault", "message": "injected_fault for good"}
    [notice] = deliveries()
    assert (notice["type"], notice["data"]["error_code"]) == ("pipeline.failed", "injected_fault")
    assert set(notice["data"]["artifacts"]) == {"lyric"}


def test_an_attempt_is_told_whole_whatever_order_its_events_come_in_and_once_however_often(gateway, engines):
    engine = engines["api"]
    pipeline_id = gateway.create()
    t0 = ago(minutes=5)
    start1, end1, start2, end2 = (t0 + dt.timedelta(seconds=s) for s in (0, 2, 3, 9))

    # Attempt 2 completed before its start (and attempt 1's end) came: a late start fills in what was
    # missing and never reopens it; a late end of attempt 1 still ends it.
    completed = gateway.event(pipeline_id, LYRIC, "completed", 2, end2)
    gateway.event(pipeline_id, LYRIC, "started", 2, start2, worker="lyric@b:2")
    gateway.event(pipeline_id, LYRIC, "started", 1, start1, worker="lyric@a:1")
    gateway.event(pipeline_id, LYRIC, "retrying", 1, end1, code="outage")

    assert attempts_of(engine, pipeline_id) == {
        ("lyric", 1): ("lyric@a:1", start1, end1, "interrupted", "outage"),
        ("lyric", 2): ("lyric@b:2", start2, end2, "succeeded", None),
    }
    with engine.connect() as conn:
        stage = conn.execute(sa.select(repository.stages).where(repository.stages.c.pipeline_id == pipeline_id)).one()
        entries = timeline_rows.timeline_after(conn, uuid.UUID(pipeline_id), 0)
    assert (stage.status, stage.attempt) == ("SUCCEEDED", 2)  # the stage never moved back
    # Events stale for their stage add no entry, but what they said of their attempts was kept.
    assert [e.event_type for e in entries] == ["pipeline.requested", "lyric.completed"]

    # The same event again: the inbox takes it once, nothing changes.
    before = attempts_of(engine, pipeline_id)
    gateway.deliver(completed)
    assert attempts_of(engine, pipeline_id) == before
    with engine.connect() as conn:
        assert len(timeline_rows.timeline_after(conn, uuid.UUID(pipeline_id), 0)) == 2

    # A cancel found song's attempt 1 ended already (its retrying was still on its way): the attempt's own
    # end wins when it comes, whichever came first; the first real end is kept against a later one.
    song_start, song_retry, canceled_at = (t0 + dt.timedelta(seconds=s) for s in (10, 12, 20))
    gateway.event(pipeline_id, SONG, "started", 1, song_start, worker="song@c:3")
    operation = gateway.cancel(pipeline_id)
    gateway.event(pipeline_id, SONG, "canceled", 1, canceled_at, operation=operation)
    assert attempts_of(engine, pipeline_id)[("song", 1)][2:4] == (canceled_at, "canceled")
    gateway.event(pipeline_id, SONG, "retrying", 1, song_retry, code="provider_error")
    assert attempts_of(engine, pipeline_id)[("song", 1)] == (
        "song@c:3",
        song_start,
        song_retry,
        "failed_retryable",
        "provider_error",
    )


def test_a_version_1_started_event_makes_an_attempt_without_a_worker(gateway, engines):
    pipeline_id = gateway.create()
    started_at = ago(seconds=30)
    v1 = events.StageStartedV1(pipeline_id=pipeline_id, stage=LYRIC, job_id="j", attempt=1, started_at=started_at)
    old = envelope.Envelope(
        source="/castad/lyric",
        type="lyric.started",
        subject=pipeline_id,
        schemaversion=1,
        data=v1.model_dump(mode="json"),
    )
    gateway.deliver(old)

    assert attempts_of(engines["api"], pipeline_id) == {("lyric", 1): (None, started_at, None, None, None)}


def _entries(engine: sa.Engine, position: timeline.Position, tenant: str | None = None, **filters):
    viewer = disclosure.INTERNAL if tenant is None else disclosure.Viewer(tenant, keyring.Keyring(engine))
    return timeline_routes.entries_after(engine, viewer, filters.get("status"), filters.get("stage"), position)


class _UncommittedEntry:
    """A transaction that wrote an entry of the pipeline's timeline and has not ended (the caller ends it)."""

    def __init__(self, engine: sa.Engine, pipeline_id: str) -> None:
        self._transaction = db.transaction(engine)
        conn = self._transaction.__enter__()
        pipeline = repository.lock_pipeline(conn, uuid.UUID(pipeline_id))
        projection.record(
            conn, pipeline, uuid.uuid4(), "dead_letter.recorded", None, "dead_letter_recorded", reason="x"
        )

    def commit(self) -> None:
        self._transaction.__exit__(None, None, None)

    def rollback(self) -> None:
        ended = RuntimeError("rolled back by the test")
        assert not self._transaction.__exit__(RuntimeError, ended, None)


def test_the_stream_of_every_pipeline_waits_for_an_entry_still_to_commit_and_passes_one_rolled_back(
    gateway, engines, monkeypatch
):
    engine = engines["api"]
    monkeypatch.setattr(timeline_routes, "GAP_WAIT_S", 0.5)
    first, second = gateway.create("First"), gateway.create("Second")
    with engine.connect() as conn:
        start = timeline.Position(timeline_rows.newest_entry(conn))

    slow = _UncommittedEntry(engine, first)  # takes the next seq, commits later
    gateway.event(second, LYRIC, "started", 1, ago(seconds=3))
    waiting = _entries(engine, start)
    assert waiting.messages == [] and waiting.cursor.after == start.after and waiting.cursor.waiting_since is not None

    slow.commit()
    caught_up = _entries(engine, waiting.cursor)
    shown = [(json.loads(m["data"])["pipeline_id"], json.loads(m["data"])["status"]) for m in caught_up.messages]
    assert shown == [(first, "dead_letter_recorded"), (second, "started")]
    assert [int(m["id"]) for m in caught_up.messages] == [start.after + 1, start.after + 2]
    assert caught_up.cursor == timeline.Position(start.after + 2)

    lost = _UncommittedEntry(engine, first)
    gateway.event(second, LYRIC, "retrying", 1, ago(seconds=2))
    held = _entries(engine, caught_up.cursor)
    assert held.messages == []
    assert _entries(engine, held.cursor) == held  # read again before the wait is over: still held
    lost.rollback()
    monkeypatch.setattr(timeline_routes, "time", _Clock(held.cursor.waiting_since or 0.0, later_s=0.6))
    passed = _entries(engine, held.cursor)
    [message] = passed.messages
    retrying = json.loads(message["data"])
    assert (retrying["pipeline_id"], retrying["event_type"], retrying["seq"], message["id"]) == (
        second,
        "lyric.retrying",
        3,  # its pipeline's third entry (requested, started, retrying)
        str(start.after + 4),  # an admin's stream: the entry's place among all of the gateway's
    )


class _Clock:
    """time.monotonic `later_s` after `since`."""

    def __init__(self, since: float, later_s: float) -> None:
        self.value = since + later_s

    def monotonic(self) -> float:
        return self.value


def test_the_stream_of_every_pipeline_shows_a_tenant_its_own_entries_that_match_its_filters(gateway, engines):
    engine = engines["api"]
    with engine.connect() as conn:
        start = timeline.Position(timeline_rows.newest_entry(conn))
    ours = gateway.create("바다책방", tenant="alice", region="속초")
    theirs = gateway.create("Other", tenant="bob")
    gateway.event(ours, LYRIC, "started", 1, ago(seconds=9))
    gateway.event(theirs, LYRIC, "started", 1, ago(seconds=8))
    gateway.event(ours, LYRIC, "completed", 1, ago(seconds=7))
    gateway.event(ours, SONG, "started", 1, ago(seconds=6))

    def seen(tenant: str | None, **filters) -> list[tuple[str, str]]:
        batch = _entries(engine, start, tenant, **filters)
        assert batch.cursor.after == start.after + 6  # every entry looked at, shown or not
        return [(json.loads(m["data"])["customer_name"], json.loads(m["data"])["event_type"]) for m in batch.messages]

    assert seen("alice") == [
        ("바다책방", "pipeline.requested"),
        ("바다책방", "lyric.started"),
        ("바다책방", "lyric.completed"),
        ("바다책방", "song.started"),
    ]
    assert seen(None, stage=LYRIC) == [
        ("바다책방", "lyric.started"),
        ("Other", "lyric.started"),
        ("바다책방", "lyric.completed"),
    ]
    assert seen("alice", status=model.PipelineStatus.PENDING) == [("바다책방", "pipeline.requested")]
    assert seen("bob", stage=SONG) == []
    message = _entries(engine, start, "alice").messages[-1]
    data = json.loads(message["data"])
    assert (message["event"], data["seq"], data["tenant"], data["region"]) == ("entry", 4, "alice", "속초")
    assert not message["id"].isdigit()  # a tenant's cursor counts nothing


def test_the_new_routes_hold_to_tenants_and_scopes(gateway, engines, api):
    engine = engines["api"]
    alice_id = gateway.create("Alice Cafe", tenant="alice")
    served = api()
    reader = served.client(make_key(engine, "alice", keys.Scope.READ))
    stranger = served.client(make_key(engine, "bob", keys.Scope.READ, keys.Scope.OPERATE))
    submitter = served.client(make_key(engine, "alice", keys.Scope.SUBMIT))
    admin = served.client(make_key(engine, "ops", *keys.Scope))
    timeline_path = f"/v1/pipelines/{alice_id}/timeline"

    assert reader.get(timeline_path).status_code == 200
    assert admin.get(timeline_path).status_code == 200
    # Another tenant's pipeline does not exist for bob, exactly as one that does not exist at all.
    for pipeline_id in (alice_id, str(uuid.uuid4())):
        answer = stranger.get(f"/v1/pipelines/{pipeline_id}/timeline")
        assert (answer.status_code, answer.json()) == (404, {"detail": f"no pipeline {pipeline_id}"})
    for client, status in ((served.client(None), 401), (served.client("cad_not-a-key"), 401), (submitter, 403)):
        for path in (timeline_path, "/v1/events", "/v1/stats"):
            assert client.get(path).status_code == status, (path, status)
    # The numbers span every tenant: admin only.
    assert reader.get("/v1/stats").status_code == 403
    assert admin.get("/v1/stats").status_code == 200
    # Bad input: a 422 naming the field.
    for path, params, field in (
        (timeline_path, {"limit": 0}, "limit"),
        (timeline_path, {"after": -1}, "after"),
        ("/v1/stats", {"window": "1w"}, "window"),
        ("/v1/stats", {"window": "30"}, "window"),
        ("/v1/events", {"status": "DONE"}, "status"),
        ("/v1/events", {"stage": "dance"}, "stage"),
    ):
        answer = admin.get(path, params=params)
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][-1] == field, (path, answer.text)
    bad_resume = admin.get("/v1/events", headers={"Last-Event-ID": "x1"})
    assert bad_resume.status_code == 422 and "Last-Event-ID" in bad_resume.text


@pytest.mark.parametrize("recent", [listing.RECENT, 1], ids=["among the newest", "among every match"])
def test_the_listing_finds_a_pipeline_by_its_id_or_a_part_of_its_customers_name(
    gateway, engines, api, monkeypatch, recent
):
    monkeypatch.setattr(listing, "RECENT", recent)  # 1: the newest pipeline never holds a page
    engine = engines["api"]
    names = {"바다책방": "alice", "Cafe Blue": "alice", "BLUE Harbor": "alice", "50%_off": "alice", "Blue Bob": "bob"}
    made = {name: gateway.create(name, tenant=tenant) for name, tenant in names.items()}
    alice = api().client(make_key(engine, "alice", keys.Scope.READ))

    def found(q: str, limit: int = 20) -> list[str]:
        answer = alice.get("/v1/pipelines", params={"q": q, "limit": limit})
        assert answer.status_code == 200, answer.text
        return [item["brief"]["customer_name"] for item in answer.json()["items"]]

    assert found("blue") == ["BLUE Harbor", "Cafe Blue"]  # newest first, any case; bob's is not alice's to see
    assert found("다책방") == ["바다책방"] and found("arbo") == ["BLUE Harbor"]  # anywhere in the name
    # Shorter than a trigram: the beginning of a word of the name.
    assert found("바다") == ["바다책방"] and found("ha") == ["BLUE Harbor"] and found("C") == ["Cafe Blue"]
    assert found("책방") == [] and found("ar") == []
    assert found("%_o") == ["50%_off"] and found("5") == ["50%_off"] and found("_") == []  # not patterns
    assert found(made["Cafe Blue"]) == ["Cafe Blue"]
    assert found(made["Blue Bob"]) == []
    assert found("nothing like it") == []
    # Pages of a search follow each other.
    first = alice.get("/v1/pipelines", params={"q": "blue", "limit": 1}).json()
    rest = alice.get("/v1/pipelines", params={"q": "blue", "limit": 1, "cursor": first["next_cursor"]}).json()
    assert [i["brief"]["customer_name"] for i in first["items"] + rest["items"]] == ["BLUE Harbor", "Cafe Blue"]
    assert rest["next_cursor"] is None
    assert alice.get("/v1/pipelines", params={"q": "a\x00b"}).status_code == 422
    assert alice.get("/v1/pipelines", params={"q": "x" * 81}).status_code == 422


def follow(
    http: httpx.Client, received: list, last_event_id: str | None = None, opened: threading.Event | None = None
) -> float:
    """Read /v1/events until the gateway closes it, into `received` as (id, event, data).

    Seconds it stayed open. `opened` is set once its answer began (its starting point is read before that).
    """
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    started = time.monotonic()
    with httpx_sse.connect_sse(http, "GET", "/v1/events", headers=headers, timeout=httpx.Timeout(10, read=5)) as source:
        assert source.response.status_code == 200, source.response.read()
        assert source.response.headers["content-type"].startswith("text/event-stream")
        if opened is not None:
            opened.set()
        for sse in source.iter_sse():
            if sse.data:
                received.append((sse.id, sse.event, json.loads(sse.data)))
    return time.monotonic() - started


def test_the_stream_of_every_pipeline_follows_new_entries_through_an_outage_closes_and_resumes(
    gateway, api, installation
):
    gateway.create("Before the stream")
    served = api(firehose_max_s=8, sse_poll_s=0.2, sse_ping_s=0.5)
    http = served.client(installation.api_key)
    received: list = []
    opened = threading.Event()
    reader = threading.Thread(target=lambda: received.append(follow(http, received, opened=opened)))
    reader.start()
    assert opened.wait(10)

    pipeline_id = gateway.create("바다책방")
    waits.until(lambda: len(received) >= 1, what="the new pipeline on the stream")
    with outage.database_down(installation.database_urls["api"]):
        time.sleep(1.5)  # reads fail meanwhile: the stream waits, keep-alives go on
    gateway.event(pipeline_id, LYRIC, "started", 1, ago(seconds=1), worker="lyric@a:1")
    reader.join(20)

    *entries, open_s = received
    assert not reader.is_alive() and 7 <= open_s < 15  # closed by the gateway after its lifetime
    shown = [(data["pipeline_id"], data["event_type"], data["customer_name"]) for _, _, data in entries]
    assert shown == [(pipeline_id, "pipeline.requested", "바다책방"), (pipeline_id, "lyric.started", "바다책방")]
    assert [(event, data["seq"]) for _, event, data in entries] == [("entry", 1), ("entry", 2)]
    assert int(entries[0][0]) < int(entries[1][0])  # an admin's cursors: places among all of the gateway's entries
    assert entries[1][2]["worker"] == "lyric@a:1" and entries[1][2]["tenant"] == TEST_KEY_TENANT

    # Resumed after the first entry: the second, and what came since.
    gateway.event(pipeline_id, LYRIC, "completed", 1, ago(seconds=0))
    again: list = []
    follow(api(firehose_max_s=1).client(installation.api_key), again, last_event_id=entries[0][0])
    assert [data["event_type"] for _, _, data in again] == ["lyric.started", "lyric.completed"]
