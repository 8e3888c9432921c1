"""Retention end to end.

Every service, as its own process, deletes what of its own outlived its time, and nothing of a pipeline that is
still recent.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from castad_api import tables as api_tables
from castad_contracts import topology
from castad_runtime import tables
from castad_testkit import briefs

pytestmark = pytest.mark.e2e

AGED = sa.text("now() - interval '100 days'")  # past every default retention (the longest: 90 days)


def age(dbs, pipeline_id: str) -> None:
    """Move every time each service keeps of a pipeline 100 days into the past."""
    for service, engine in dbs.engines.items():
        with engine.begin() as conn:
            for table, column in ((tables.outbox, "published_at"), (tables.inbox, "received_at")):
                conn.execute(table.update().where(table.c.pipeline_id == pipeline_id).values({column: AGED}))
            if service != "api":
                jobs = tables.jobs
                conn.execute(jobs.update().where(jobs.c.pipeline_id == pipeline_id).values(finished_at=AGED))
                continue
            for table, columns, key in (
                (api_tables.pipelines, ("created_at", "finished_at"), "id"),
                (api_tables.stages, ("finished_at",), "pipeline_id"),
                (api_tables.timeline, ("created_at",), "pipeline_id"),
            ):
                values = dict.fromkeys(columns, AGED)
                conn.execute(table.update().where(table.c[key] == pipeline_id).values(values))


def kept(dbs, pipeline_id: str) -> dict[str, int]:
    """Rows each service still keeps of a pipeline, per table (only the non-empty ones)."""
    counted = {}
    for service in dbs.engines:
        owned = [tables.outbox, tables.inbox] + (
            [api_tables.pipelines, api_tables.stages, api_tables.timeline] if service == "api" else [tables.jobs]
        )
        for table in owned:
            column = table.c.id if table is api_tables.pipelines else table.c.pipeline_id
            n = dbs.scalar(service, sa.select(sa.func.count()).select_from(table).where(column == pipeline_id))
            if n:
                counted[f"{service}.{table.name}"] = n
    return counted


@pytest.mark.timeout(180)
def test_every_service_deletes_what_outlived_its_retention_and_nothing_recent(castad, dbs, installation):
    running = castad({"CASTAD_RETENTION_INTERVAL_S": "0.5"})
    old, recent = running.submit(briefs.sample("오래된 가게")), running.submit(briefs.sample("새 가게"))
    views = running.wait_terminal([old, recent])
    assert {view.status for view in views.values()} == {"SUCCEEDED"}
    running.wait_until("every event published", lambda: not dbs.unpublished())
    before = kept(dbs, recent)
    assert all((installation.artifacts_dir / stage / old).is_dir() for stage in topology.STAGES)

    age(dbs, old)
    running.wait_until("every service deleted what it kept of the old pipeline", lambda: not kept(dbs, old))

    assert not any((installation.artifacts_dir / stage / old).exists() for stage in topology.STAGES)
    assert kept(dbs, recent) == before
    assert all(f"{service}.jobs" in before for service in topology.STAGES)
    assert [
        sorted(path.name.split("-")[0] for path in (installation.artifacts_dir / stage / recent).iterdir())
        for stage in topology.STAGES
    ] == [[stage] * (2 if stage == "video" else 1) for stage in topology.STAGES]  # the video and its poster
    assert running.http.get(f"/v1/pipelines/{old}").status_code == 404
    assert running.http.get(f"/v1/pipelines/{recent}/artifacts/video").status_code == 200
