"""Nothing waits on the world inside a database transaction (db.outside).

A store's put or delete, and every call that leaves Castad (the client's own, or one run on a thread of its own by
an attempt's `Cancellation`), is refused while the thread holds a transaction of a service's engine open (an
explicit one, or one SQLAlchemy began on its own), so that a slow bucket or provider never holds row locks; the same
work right after the transaction ends goes on. Service code that did otherwise would fail every test that runs it.
"""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db, outbound
from castad_runtime.artifacts import volume
from castad_runtime.stage import cancellation

pytestmark = pytest.mark.integration
PIPELINE = "0b4f3b8e-3f0e-4c57-9d1a-6f3f1f0b9a11"


@pytest.fixture
def engine(installation):
    made = db.make_engine(installation.database_urls["lyric"], 2)
    try:
        yield made
    finally:
        made.dispose()


def test_a_store_write_and_a_call_out_are_refused_inside_a_transaction_and_go_on_after_it(engine, tmp_path):
    store = volume.VolumeStore(tmp_path)
    client = outbound.Client(
        allow_private=False, timeout_s=5, transport=httpx.MockTransport(lambda _: httpx.Response(204))
    )

    with db.transaction(engine) as conn:
        conn.execute(sa.text("SELECT 1"))
        with pytest.raises(db.TransactionOpen, match="VolumeStore.keep_image inside a database transaction"):
            store.keep_image(b"an image", "hana", "image/png")
        with (
            pytest.raises(db.TransactionOpen, match="a call to provider.example inside"),
            client.stream("GET", "https://provider.example/v1/songs"),
        ):
            pass
        with pytest.raises(db.TransactionOpen, match="a call out inside"):
            cancellation.Cancellation().call(lambda: "made on a thread of its own, which holds no transaction")
    with engine.connect() as conn:  # a transaction SQLAlchemy began by itself, for a read
        conn.execute(sa.text("SELECT 1"))
        with pytest.raises(db.TransactionOpen, match="VolumeStore.delete inside"):
            store.delete(PIPELINE, events.Stage.LYRIC)

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # each statement commits alone
        conn.execute(sa.text("SELECT 1"))
        assert store.delete(PIPELINE, events.Stage.LYRIC) == 0
    kept = store.keep_image(b"an image", "hana", "image/png")
    assert cancellation.Cancellation().call(lambda: "called") == "called"
    with client.stream("GET", "https://provider.example/v1/songs") as answer:
        assert answer.status_code == 204
    assert kept.size == len(b"an image") and store.delete(PIPELINE, events.Stage.LYRIC) == 0


def test_a_transaction_that_failed_or_was_rolled_back_holds_nothing_open(engine, tmp_path):
    store = volume.VolumeStore(tmp_path)
    with pytest.raises(ZeroDivisionError), db.transaction(engine) as conn:
        conn.execute(sa.text("SELECT 1"))
        raise ZeroDivisionError
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.rollback()
        assert store.delete(PIPELINE, events.Stage.LYRIC) == 0  # no transaction open any more on this connection
