"""A provider's quota on a real PostgreSQL: concurrent claims take tokens from different rows of its bucket,
and the jobs in flight counted by the triggers are the jobs RUNNING or AWAITING, exactly, whatever moved them
and however many at once; no claim takes them past the cap."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_runtime import db, tables
from castad_runtime.stage import machine, quota, repository
from castad_runtime.stage.repository import attempts, claiming, operations

pytestmark = pytest.mark.integration

Status = machine.Status
CAP = 25
JOBS = 120
WORKERS = 8
TURNS = 150  # transactions per worker


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["song"]


def provider(engine: sa.Engine, **limits: Any) -> str:
    name = f"provider-{uuid.uuid4().hex[:8]}"
    values = {"max_rate_per_s": 1e6, "min_rate_per_s": 1.0, "burst": 1e6, **limits}
    with db.transaction(engine) as conn:
        quota.configure(conn, quota.Limits(provider=name, **values))
    return name


def add_jobs(engine: sa.Engine, count: int) -> list[str]:
    pipelines = [f"p-{uuid.uuid4().hex[:12]}" for _ in range(count)]
    with db.transaction(engine) as conn:
        for pipeline_id in pipelines:
            claiming.accept_trigger(conn, pipeline_id, {"brief": {}}, 1, 1000, None, None)
    return pipelines


def counted_and_real(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        real = conn.execute(
            sa.select(sa.func.count()).where(tables.jobs.c.status.in_([Status.RUNNING, Status.AWAITING]))
        ).scalar_one()
        return quota.jobs_in_flight(conn), real


def test_concurrent_claims_each_hold_a_shard_of_their_own(engine):
    name = provider(engine)
    with engine.connect() as first, engine.connect() as second, first.begin(), second.begin():
        held = [quota.gate(first, name), quota.gate(second, name)]
    assert all(gate.open and gate.new_work for gate in held)
    assert held[0].shard != held[1].shard
    with engine.connect() as conn:
        assert quota.state(conn, name)["shards"] == quota.MAX_SHARDS


def test_a_slow_provider_keeps_one_bucket_whose_tokens_come_at_its_rate(engine):
    assert quota.Limits("slow", max_rate_per_s=5.0, min_rate_per_s=0.2, burst=5.0).shards == 1
    assert quota.Limits("fast", max_rate_per_s=1000.0, min_rate_per_s=1.0, burst=3.0).shards == 3
    assert quota.Limits("fast", max_rate_per_s=1000.0, min_rate_per_s=1.0, burst=500.0).shards == quota.MAX_SHARDS


class Driver:
    """Workers moving the jobs through every kind of change of status at once, as replicas and operators do."""

    def __init__(self, engine: sa.Engine, name: str, pipelines: list[str]) -> None:
        self.engine = engine
        self.name = name
        self.pipelines = pipelines
        self.done: Counter[str] = Counter()
        self.most_in_flight = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(TURNS):
                action = rng.choices(["claim", "operator", "recover", "watch"], weights=[6, 2, 1, 1])[0]
                getattr(self, action)(rng)
        except BaseException as error:  # reported by the test
            self.errors.append(error)

    def note(self, what: str) -> None:
        with self._lock:
            self.done[what] += 1

    def claim(self, rng: random.Random) -> None:
        """Claim within the quota (a lease that may run out at once), then move the claim on, or leave it."""
        lease_s = rng.choice([30.0, 0.0])
        with db.transaction(self.engine) as conn:
            job = claiming.claim_next(conn, f"w{rng.random()}", lease_s, self.name)
        if not isinstance(job, repository.Job):
            return
        self.note("claimed")
        outcome = rng.choice(["succeeded", "failed", "retry", "awaiting", "awaiting", "left"])
        with db.transaction(self.engine) as conn:
            if outcome == "succeeded":
                moved = attempts.finish_attempt(conn, job, Status.SUCCEEDED, "succeeded", result={})
            elif outcome == "failed":
                moved = attempts.finish_attempt(conn, job, Status.FAILED, "failed", error_code="x")
            elif outcome == "retry":
                moved = attempts.finish_attempt(conn, job, Status.RETRY_WAIT, "failed_retryable", retry_in_s=0.0)
            elif outcome == "awaiting":
                moved = attempts.await_provider(conn, job, job.handle or "work", 0.0)
            else:
                moved = True
        if moved:
            self.note(outcome)

    def operator(self, rng: random.Random) -> None:
        """Cancel a job that has not ended, or retry one that failed or was canceled."""
        with db.transaction(self.engine) as conn:
            held = operations.lock(conn, rng.choice(self.pipelines))
            assert held is not None
            if held.status in (Status.FAILED, Status.CANCELED):
                operations.reopen(conn, held, held.last_operation + 1, Status.PENDING, 1000, held.input)
                self.note("retried")
            elif not held.status.terminal:
                operations.cancel(conn, held, held.last_operation + 1, "test")
                self.note("canceled")

    def recover(self, rng: random.Random) -> None:
        """Hand back the claims whose lease ran out, several in one transaction, as a recovering runner does."""
        with db.transaction(self.engine) as conn:
            for job in claiming.expired_leases(conn, limit=10):
                if job.polling:
                    assert job.handle is not None
                    moved = attempts.await_provider(conn, job, job.handle, 0.0)
                else:
                    moved = attempts.finish_attempt(
                        conn, job, Status.RETRY_WAIT, "interrupted", retry_in_s=0.0, counted=False
                    )
                if moved:
                    self.note("recovered")

    def watch(self, rng: random.Random) -> None:
        with self.engine.connect() as conn:
            real = conn.execute(
                sa.select(sa.func.count()).where(tables.jobs.c.status.in_([Status.RUNNING, Status.AWAITING]))
            ).scalar_one()
        with self._lock:
            self.most_in_flight = max(self.most_in_flight, real)


def test_the_count_of_jobs_in_flight_stays_exact_through_every_change_made_at_once(engine):
    before = counted_and_real(engine)
    assert before[0] == before[1]
    name = provider(engine, max_in_flight=CAP)
    driver = Driver(engine, name, add_jobs(engine, JOBS))

    workers = [threading.Thread(target=driver.run, args=(seed,)) for seed in range(WORKERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)

    assert not any(worker.is_alive() for worker in workers)
    assert driver.errors == []
    counted, real = counted_and_real(engine)
    assert counted == real
    assert 0 < driver.most_in_flight <= CAP and real <= CAP
    for what in ("claimed", "succeeded", "failed", "retry", "awaiting", "canceled", "retried", "recovered"):
        assert driver.done[what] > 0, what
    with engine.connect() as conn:
        rows = conn.execute(sa.select(tables.in_flight_counts)).all()
    assert all(row.jobs <= row.cap for row in rows)  # no claim took a row past its share of the cap


def test_the_count_follows_jobs_written_and_deleted_by_hand_and_a_truncate(engine):
    name = provider(engine)
    add_jobs(engine, 3)
    with db.transaction(engine) as conn:
        job = claiming.claim_next(conn, "w", 30.0, name)
        assert isinstance(job, repository.Job)
        conn.execute(tables.jobs.update().where(tables.jobs.c.status == Status.PENDING).values(status=Status.AWAITING))
    assert counted_and_real(engine) == (3, 3)
    with db.transaction(engine) as conn:
        conn.execute(tables.attempts.delete())
        conn.execute(tables.jobs.delete().where(tables.jobs.c.id == job.id))
    assert counted_and_real(engine) == (2, 2)
    with db.transaction(engine) as conn:
        conn.execute(sa.text("TRUNCATE jobs CASCADE"))
    assert counted_and_real(engine) == (0, 0)


def test_a_cap_set_after_jobs_were_counted_still_holds(engine):
    add_jobs(engine, 3)
    name = provider(engine)
    for _ in range(2):
        with db.transaction(engine) as conn:
            assert isinstance(claiming.claim_next(conn, "w", 30.0, name), repository.Job)
    capped = provider(engine, max_in_flight=2)

    with db.transaction(engine) as conn:
        assert claiming.claim_next(conn, "w", 30.0, capped) == claiming.QuotaWait(quota.IN_FLIGHT_CAP)
    assert counted_and_real(engine) == (2, 2)
