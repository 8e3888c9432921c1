"""Record processed event ids in the handler's transaction: effects happen once."""

from __future__ import annotations

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import tables


def first_delivery(conn: sa.Connection, env: envelope_.Envelope) -> bool:
    """True the first time this event id is seen; False for a redelivery or duplicate."""
    inserted = conn.execute(
        pg.insert(tables.inbox)
        .values(event_id=env.id, event_type=env.type, pipeline_id=env.subject)
        .on_conflict_do_nothing()
        .returning(tables.inbox.c.event_id)
    ).first()
    return inserted is not None
