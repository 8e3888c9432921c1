"""Ids Castad makes: time-ordered where they key a table that grows fast, random where they must not be guessed.

A random (version 4) UUID lands anywhere in its B-tree index, so that at a high insert rate every insert
dirties a page of its own: the index is all written over between two checkpoints, each page once in full into
the WAL, and its pages are read back from disk once the index outgrows memory. A version 7 UUID begins with
the millisecond it was made, so that new ids land together at the index's right-hand end, as a sequence's
do (docs/reports/retention.md measures the difference). It is still a UUID: the event contract, the columns
and every parser are the same.

Its first 48 bits say when it was made, and the rest is random: an id that must not be guessed, or that
must not tell when it was made (a pipeline's id, which every URL of it names; a key's; a secret's), stays a
version 4 UUID, made with `uuid.uuid4()` where it is made.
"""

from __future__ import annotations

import uuid

from uuid_utils import compat


def time_ordered() -> uuid.UUID:
    """Return a new version 7 UUID: later ones sort after earlier ones, even within one millisecond."""
    return compat.uuid7()
