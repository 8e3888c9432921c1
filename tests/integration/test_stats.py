"""The operator's numbers (/v1/stats) against a known set of pipelines, on a real PostgreSQL.

From the gateway's projection: exact counts, rates and percentiles (PostgreSQL's percentile_cont: linear between
ranks).
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import sqlalchemy as sa
from castad_api import dead_letters, keys, repository
from castad_contracts import events, topology
from castad_runtime import db
from pytest import approx

from tests.integration.gateway import make_key, now

pytestmark = pytest.mark.integration
LYRIC, SONG, VIDEO = events.STAGE_ORDER


def letter(engine: sa.Engine, kind: str) -> int:
    fields = {"message_id": str(uuid.uuid4()), "kind": kind, "reason": "unknown type", "headers": {}, "body": b"{}"}
    with db.transaction(engine) as conn:
        letter_id = dead_letters.record(conn, {**fields, "body_size": 2})
    assert letter_id is not None
    return letter_id


@pytest.fixture
def known(gateway, engines):
    """Eight pipelines with known histories (times before now, `t`):

    A, B succeeded within the hour (B's lyric failed once first); C failed (its lyric refused); D runs its
    song, started 2 h ago: stuck; E waits for its lyric's next attempt (a worker stopped); F was just
    accepted; G was canceled while its lyric ran; H succeeded 3 h ago. Dead letters: a message, a parked
    row, and a message discarded."""
    engine = engines["api"]
    t = now()

    def ago(minutes: float, seconds: float = 0) -> dt.datetime:
        return t - dt.timedelta(minutes=minutes) + dt.timedelta(seconds=seconds)

    a, b, c, d, e, f, g, h = (gateway.create(f"Cafe {name}") for name in "ABCDEFGH")
    gateway.run(a, LYRIC, ago(40), 10)
    gateway.run(a, SONG, ago(39), 20)
    gateway.run(a, VIDEO, ago(38), 30)

    gateway.event(b, LYRIC, "started", 1, ago(30))
    gateway.event(b, LYRIC, "retrying", 1, ago(30, 5), code="provider_error")
    gateway.run(b, LYRIC, ago(30, 60), 20, attempt=2)
    gateway.run(b, SONG, ago(28), 40)
    gateway.run(b, VIDEO, ago(27), 50)

    gateway.event(c, LYRIC, "started", 1, ago(20))
    gateway.event(c, LYRIC, "failed", 1, ago(20, 3), code="content_refused")

    gateway.run(d, LYRIC, ago(180), 15)
    gateway.event(d, SONG, "started", 1, ago(120), worker="song@stuck:9")

    gateway.event(e, LYRIC, "started", 1, ago(5))
    gateway.event(e, LYRIC, "retrying", 1, ago(5, 7), code="worker_stopped")

    gateway.event(g, LYRIC, "started", 1, ago(10))
    operation = gateway.cancel(g)
    gateway.event(g, LYRIC, "canceled", 1, ago(9), operation=operation)
    gateway.event(g, SONG, "canceled", 0, ago(9), operation=operation)
    gateway.event(g, VIDEO, "canceled", 0, ago(9), operation=operation)

    gateway.run(h, LYRIC, ago(180), 12)
    gateway.run(h, SONG, ago(179), 22)
    gateway.run(h, VIDEO, ago(178), 32)
    with db.transaction(engine) as conn:  # accepted and ended before the hour (the projection says "now")
        conn.execute(
            repository.pipelines.update()
            .where(repository.pipelines.c.id == uuid.UUID(h))
            .values(created_at=ago(180), finished_at=ago(177))
        )

    letter(engine, "message")
    letter(engine, "parked")
    with db.transaction(engine) as conn:
        dead_letters.discard(conn, letter(engine, "message"), "ops", "a test message")
    return {"d": d, "f": f, "t": t}


def test_the_numbers_of_the_last_hour_are_exactly_those_of_the_known_pipelines(known, engines, api):
    admin = api(stuck_after_s=1800).client(make_key(engines["api"], "ops", *keys.Scope))

    answer = admin.get("/v1/stats", params={"window": "1h"})

    assert answer.status_code == 200, answer.text
    stats = answer.json()
    assert stats["window_s"] == 3600 and stats["stuck_after_s"] == 1800
    assert stats["pipelines"] == {
        "in_flight": 3,
        "in_flight_by_status": {"RUNNING": 2, "PENDING": 1},
        "created": 7,
        "finished": {"SUCCEEDED": 2, "FAILED": 1, "CANCELED": 1},
    }
    lyric, song, video = stats["stages"]
    assert [s["stage"] for s in stats["stages"]] == list(topology.STAGES)

    # Where the pipelines in flight are: F waits for its lyric, E for its lyric's next attempt, D runs its song.
    places = [(s["pending"], s["running"], s["retry_waiting"], s["stuck"]) for s in stats["stages"]]
    assert places == [(1, 0, 1, 0), (0, 1, 0, 1), (0, 0, 0, 0)]

    # Runs of each stage that ended within the hour, and how long the successful ones took from first start.
    assert (lyric["succeeded"], lyric["failed"], lyric["canceled"]) == (2, 1, 1)
    assert lyric["failure_rate"] == approx(1 / 3)
    assert lyric["duration_s"] == {"count": 2, "p50": approx(45.0), "p95": approx(76.5), "p99": approx(79.3)}
    assert (song["succeeded"], song["failed"], song["canceled"], song["failure_rate"]) == (2, 0, 1, 0.0)
    assert song["duration_s"] == {"count": 2, "p50": approx(30.0), "p95": approx(39.0), "p99": approx(39.8)}
    assert video["duration_s"] == {"count": 2, "p50": approx(40.0), "p95": approx(49.0), "p99": approx(49.8)}

    # Attempts that ended within the hour: lyric's took 10, 5, 20, 3, 7 and 60 s.
    assert lyric["attempts"] == 6
    assert lyric["attempt_outcomes"] == {
        "succeeded": 2,
        "failed_retryable": 1,
        "failed": 1,
        "interrupted": 1,
        "canceled": 1,
    }
    assert lyric["errors"] == [
        {"code": code, "count": 1, "rate": approx(1 / 6)}
        for code in ("canceled", "content_refused", "provider_error", "worker_stopped")
    ]
    assert lyric["attempt_duration_s"] == {"count": 6, "p50": approx(8.5), "p95": approx(50.0), "p99": approx(58.0)}
    assert (song["attempts"], song["attempt_outcomes"], song["errors"]) == (2, {"succeeded": 2}, [])
    assert song["attempt_duration_s"]["p50"] == approx(30.0)

    [stuck] = stats["stuck"]
    assert (stuck["pipeline_id"], stuck["stage"], stuck["attempt"], stuck["worker"]) == (
        known["d"],
        "song",
        1,
        "song@stuck:9",
    )
    assert stuck["running_s"] == approx(7200, abs=60)

    assert stats["dead_letters"] == {
        "open": {"message": 1, "parked": 1},
        "received": {"message": {"dead": 1, "discarded": 1}, "parked": {"dead": 1}},
    }

    throughput = stats["throughput"]
    assert throughput["bucket_s"] == 60 and len(throughput["buckets"]) == 60
    assert throughput["per_minute"] == {
        "created": approx(7 / 60),
        "succeeded": approx(2 / 60),
        "failed": approx(1 / 60),
        "canceled": approx(1 / 60),
    }
    totals = {name: sum(bucket[name] for bucket in throughput["buckets"]) for name in throughput["per_minute"]}
    assert totals == {"created": 7, "succeeded": 2, "failed": 1, "canceled": 1}
    starts = [dt.datetime.fromisoformat(bucket["start"]) for bucket in throughput["buckets"]]
    assert starts[0] == dt.datetime.fromisoformat(stats["since"])
    assert all(later - earlier == dt.timedelta(minutes=1) for earlier, later in zip(starts, starts[1:], strict=False))


def test_a_longer_window_takes_in_what_ended_before_the_hour(known, engines, api):
    admin = api(stuck_after_s=1800).client(make_key(engines["api"], "ops", *keys.Scope))

    stats = admin.get("/v1/stats", params={"window": "24h"}).json()

    assert stats["pipelines"]["created"] == 8
    assert stats["pipelines"]["finished"] == {"SUCCEEDED": 3, "FAILED": 1, "CANCELED": 1}
    lyric = stats["stages"][0]
    # D's and H's lyric too: 10, 80, 15 and 12 s.
    assert (lyric["succeeded"], lyric["duration_s"]["count"], lyric["duration_s"]["p50"]) == (4, 4, approx(13.5))
    assert stats["throughput"]["bucket_s"] == 360 and len(stats["throughput"]["buckets"]) == 240


def test_nothing_is_stuck_while_attempts_may_still_be_running(known, engines, api):
    admin = api(stuck_after_s=3 * 3600).client(make_key(engines["api"], "ops", *keys.Scope))

    stats = admin.get("/v1/stats", params={"window": "15m"}).json()

    assert stats["stuck"] == [] and [s["stuck"] for s in stats["stages"]] == [0, 0, 0]
    assert stats["stages"][1]["running"] == 1
    # Within a quarter of an hour, only the attempts of E and G ended (7 and 60 s).
    assert stats["stages"][0]["attempt_duration_s"] == {
        "count": 2,
        "p50": approx(33.5),
        "p95": approx(57.35),
        "p99": approx(59.47),
    }
    assert stats["stages"][0]["duration_s"] is None and stats["stages"][0]["failure_rate"] is None
