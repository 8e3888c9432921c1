"""The pipelines a listing shows, newest first: by tenant, status, stage, a page's cursor, or a name searched.

bench/stats.py explains its statements, and measures them on a million pipelines.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import sqlalchemy as sa
from castad_contracts import events

from castad_api import model, records, tables
from castad_api.repository import pipeline_row

pipelines = tables.pipelines


@dataclasses.dataclass(frozen=True)
class Listing:
    """What a listing of pipelines shows.

    `after` is the (created_at, id) of the last row of the previous page; `search` a pipeline id, or a part of the
    customer's name (see _named).
    """

    status: model.PipelineStatus | None = None
    stage: events.Stage | None = None
    after: tuple[dt.datetime, uuid.UUID] | None = None
    tenant: str | None = None
    search: str | uuid.UUID | None = None


def list_pipelines(conn: sa.Connection, shown: Listing, limit: int) -> list[records.Pipeline]:
    """The page of pipelines `shown` selects, newest first.

    A name is looked for among the newest RECENT pipelines first (a frequent one fills the page there at once), and
    only if they hold too few, among all its matches through the trigram index pipelines_customer_name: either way
    the page is the newest matches, and no search reads more than RECENT rows or its matches.
    """
    if isinstance(shown.search, str):
        rows = [pipeline_row(row) for row in conn.execute(listing(shown, limit, within=RECENT))]
        if len(rows) == limit:
            return rows
    return [pipeline_row(row) for row in conn.execute(listing(shown, limit))]


RECENT = 2000


def listing(shown: Listing, limit: int, within: int | None = None) -> sa.Select[Any]:
    """A statement of list_pipelines (bench/stats.py explains them).

    With a name to search, among the newest `within` pipelines, or (None) among every match of the trigram index.
    """
    conditions = []
    if shown.tenant is not None:
        conditions.append(pipelines.c.tenant == shown.tenant)
    if isinstance(shown.search, uuid.UUID):
        conditions.append(pipelines.c.id == shown.search)
    if shown.status is not None:
        conditions.append(pipelines.c.status == shown.status.value)
    if shown.stage is not None:
        conditions.append(pipelines.c.current_stage == shown.stage.value)
    if shown.after is not None:
        conditions.append(sa.tuple_(pipelines.c.created_at, pipelines.c.id) < sa.tuple_(*shown.after))
    newest = (pipelines.c.created_at.desc(), pipelines.c.id.desc())
    search = shown.search
    if not isinstance(search, str):
        return sa.select(pipelines).where(*conditions).order_by(*newest).limit(limit)
    if within is not None:
        recent = sa.select(pipelines).where(*conditions).order_by(*newest).limit(within).subquery()
        named = _named(recent.c.brief["customer_name"].astext, search)
        return sa.select(recent).where(named).order_by(recent.c.created_at.desc(), recent.c.id.desc()).limit(limit)
    # Every match through the trigram index, materialised: left to itself, the planner may read the listing
    # index from the newest down instead, betting that matches are everywhere, and lose the bet on every row
    # of the table when a tenant has none (names go with tenants: they are their customers).
    matches = (
        sa.select(pipelines.c.id, pipelines.c.created_at)
        .where(_named(CUSTOMER_NAME, search), *conditions)
        .cte("matches")
        .prefix_with("MATERIALIZED")
    )
    page = sa.select(matches).order_by(matches.c.created_at.desc(), matches.c.id.desc()).limit(limit).subquery()
    return (
        sa.select(pipelines)
        .join(page, page.c.id == pipelines.c.id)
        .order_by(page.c.created_at.desc(), page.c.id.desc())
    )


CUSTOMER_NAME = pipelines.c.brief["customer_name"].astext  # the expression of the index pipelines_customer_name
TRIGRAM = 3


def _named(name: sa.ColumnElement[str], search: str) -> sa.ColumnElement[bool]:
    """Names that hold `search` (any case), or, shorter than a trigram, have a word that starts with it.

    A trigram index finds both (ILIKE on the indexed expression itself, never wrapped in lower()).
    """
    escaped = search.replace("/", "//").replace("%", "/%").replace("_", "/_")
    if len(search) >= TRIGRAM:
        return name.ilike(f"%{escaped}%", escape="/")
    return sa.or_(name.ilike(f"{escaped}%", escape="/"), name.ilike(f"% {escaped}%", escape="/"))
