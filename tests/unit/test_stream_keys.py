"""A key's places among the event streams of one gateway process.

At most its cap, each given back once, also by a stream that was never read (its client left before the answer
began).
"""

from __future__ import annotations

import gc
import uuid

import pytest
import sqlalchemy as sa
from castad_api import stream_keys


def guard(per_key: int = 2) -> stream_keys.StreamKeys:
    return stream_keys.StreamKeys(sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"), per_key, 5.0)


def test_a_key_holds_its_cap_of_places_and_each_is_given_back_once():
    held, key, other = guard(), uuid.uuid4(), uuid.uuid4()
    first, _ = held.admit(key), held.admit(key)
    with pytest.raises(stream_keys.TooMany):
        held.admit(key)
    held.admit(other)  # a cap of its own

    first.release()
    first.release()
    assert held.open_streams(key) == 1
    held.admit(key)
    with pytest.raises(stream_keys.TooMany):
        held.admit(key)


def test_a_stream_never_read_gives_its_place_back_when_it_is_freed():
    held, key = guard(per_key=1), uuid.uuid4()

    async def never_read():
        yield {}

    stream = never_read()
    held.admit(key).bind(stream)
    assert held.open_streams(key) == 1
    del stream
    gc.collect()
    assert held.open_streams(key) == 0
