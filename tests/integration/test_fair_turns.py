"""Fair turns across tenants on a real PostgreSQL (castad_runtime.stage.fair): a tenant's backlog of hundreds holds
another tenant's few jobs back by a turn or two, not by the backlog; weights share the turns out; a tenant that was
idle saves up no turns; and every claim still goes through the provider's quota as before."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Mapping

import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from castad_runtime.stage import machine, quota, repository
from castad_runtime.stage.repository import attempts, claiming

pytestmark = pytest.mark.integration

SLOTS = 4  # the slow music API's jobs at once (its in-flight cap)
WORK_TURNS = 6  # turns a song takes there


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> Iterator[sa.Engine]:
    engine = engines["song"]
    with db.transaction(engine) as conn:  # the claims below take whatever is due: only this test's jobs are
        conn.execute(sa.text("TRUNCATE jobs, shares CASCADE"))
    yield engine
    with db.transaction(engine) as conn:
        conn.execute(sa.text("TRUNCATE jobs, shares CASCADE"))


def slow_music_api(engine: sa.Engine) -> str:
    name = f"music-{uuid.uuid4().hex[:8]}"
    limits = quota.Limits(name, max_rate_per_s=1e6, min_rate_per_s=1.0, burst=1e6, max_in_flight=SLOTS)
    with db.transaction(engine) as conn:
        quota.configure(conn, limits)
    return name


def submit(engine: sa.Engine, tenant: str | None, count: int, weight: int = 1) -> list[str]:
    """`count` briefs of `tenant` (None: a trigger of a release before shares), each a job due now."""
    share = None if tenant is None else events.Share(tenant=tenant, weight=weight)
    pipelines = [f"{tenant or 'none'}-{uuid.uuid4().hex[:12]}" for _ in range(count)]
    with db.transaction(engine) as conn:
        for pipeline_id in pipelines:
            claiming.accept_trigger(conn, pipeline_id, {"brief": {}}, 1, 3, None, None, share)
    return pipelines


class MusicApi:
    """Claims through the quota, one a turn while the API has room; each song done WORK_TURNS turns later."""

    def __init__(self, engine: sa.Engine, provider: str, fair: bool = True) -> None:
        self.engine, self.provider, self.fair = engine, provider, fair
        self.turn = 0
        self.started: dict[str, int] = {}  # pipeline -> the turn its song started
        self.finished: dict[str, int] = {}
        self._working: dict[str, repository.Job] = {}

    def run(self, turns: int) -> None:
        for _ in range(turns):
            self.turn += 1
            for pipeline_id, job in list(self._working.items()):
                if self.turn - self.started[pipeline_id] >= WORK_TURNS:
                    with db.transaction(self.engine) as conn:
                        assert attempts.finish_attempt(conn, job, machine.Status.SUCCEEDED, "succeeded", result={})
                    self.finished[pipeline_id] = self.turn
                    del self._working[pipeline_id]
            with db.transaction(self.engine) as conn:
                job = claiming.claim_next(conn, "worker", 60.0, self.provider, fair=self.fair)
            if isinstance(job, repository.Job):
                self.started[job.pipeline_id] = self.turn
                self._working[job.pipeline_id] = job

    def claims(self) -> list[str]:
        """The pipelines in the order their songs started."""
        return sorted(self.started, key=self.started.__getitem__)


def test_a_tenant_with_three_briefs_waits_a_turn_or_two_behind_another_tenants_backlog_of_200(engine):
    backlog = submit(engine, "a", 200)
    api = MusicApi(engine, slow_music_api(engine))
    api.run(30)  # the backlog has the API's every slot, and more waiting
    few = submit(engine, "b", 3)
    first_turn_after = api.turn + 1

    api.run(60)

    # The API has room for one new song a turn only as one ends; each of b's starts within two of those turns.
    new_songs = [p for p in api.claims() if api.started[p] >= first_turn_after]
    places = [new_songs.index(p) for p in few]
    assert places[0] <= 1 and all(later - earlier == 2 for earlier, later in itertools.pairwise(places))  # a, b, a, b
    assert all(p in api.finished for p in few)
    assert sum(1 for p in backlog if p in api.finished) < 60  # long before a's backlog is through
    with engine.connect() as conn:  # and the quota held: never more at the API than its cap
        assert quota.jobs_in_flight(conn) <= SLOTS


def test_oldest_first_the_same_briefs_wait_for_the_whole_backlog(engine):
    """The order before fair turns (what bench/fairness.py measures against): b's songs start after a's 200."""
    backlog = submit(engine, "a", 20)
    few = submit(engine, "b", 3)
    api = MusicApi(engine, slow_music_api(engine), fair=False)

    api.run(120)

    assert api.claims()[:20] == backlog and api.claims()[20:] == few


def test_a_tenant_of_weight_3_gets_three_turns_for_the_others_one(engine):
    submit(engine, "a", 40)
    submit(engine, "c", 40, weight=3)
    api = MusicApi(engine, slow_music_api(engine))

    api.run(200)

    first = api.claims()[:24]
    assert sum(p.startswith("c-") for p in first) == 18 and sum(p.startswith("a-") for p in first) == 6


def test_a_tenant_back_from_idling_gets_its_turn_not_the_turns_it_missed(engine):
    submit(engine, "a", 2)
    api = MusicApi(engine, slow_music_api(engine))
    api.run(20)  # a's two done: a idles from here
    submit(engine, "b", 30)
    api.run(100)  # b alone: its place in the virtual time runs far ahead of a's
    later_a, later_b = submit(engine, "a", 10), submit(engine, "b", 10)
    first_turn_after = api.turn + 1

    api.run(60)

    new_songs = [p for p in api.claims() if api.started[p] >= first_turn_after]
    # b's 30 are through: a and b, both waiting now, alternate; a does not take ten turns in a row.
    assert set(new_songs[:10]) <= set(later_a) | set(later_b)
    assert 4 <= sum(p in later_a for p in new_songs[:10]) <= 6


def test_a_job_whose_trigger_told_no_share_takes_its_turns_as_one_more_tenant(engine):
    submit(engine, "a", 30)
    untold = submit(engine, None, 2)
    api = MusicApi(engine, slow_music_api(engine))

    api.run(12)

    assert all(p in api.started for p in untold)


def test_a_claim_passes_over_a_tenant_whose_due_jobs_other_claims_hold(engine):
    [first] = submit(engine, "a", 1)  # a's turn comes first (ties go by name)
    others = submit(engine, "b", 5)
    with engine.connect() as holding, holding.begin():
        held = claiming.claim_next(holding, "one", 60.0)  # not committed: a's only job stays locked
        assert isinstance(held, repository.Job) and held.pipeline_id == first
        with db.transaction(engine) as conn:
            taken = claiming.claim_next(conn, "two", 60.0)
        assert isinstance(taken, repository.Job) and taken.pipeline_id in others  # not None while b's wait
