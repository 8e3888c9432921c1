"""A run of a benchmark or of the fault harness: its id, where its reports go, the servers it uses, its clean-up."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from types import FrameType

import castad_local
import psycopg
import sqlalchemy as sa
from castad_local import stack
from castad_runtime import db, migrations, settings

log = logging.getLogger("bench")  # the benchmarks' log; `python -m bench.<name>` shows its INFO lines

AMQP_URL = os.environ.get("CASTAD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG_URL = os.environ.get("CASTAD_BENCH_PG_URL", settings.DEFAULT_PG)  # postgresql+psycopg://user@host:port
RUN_ID = uuid.uuid4().hex[:8]
REPO_ROOT = castad_local.REPO_ROOT  # a run writes its reports, logs and files into the repository
REPORTS = REPO_ROOT / "docs" / "reports"  # every generated report, under a stable name the docs site links to


def database_url(name: str) -> str:
    return f"{PG_URL}/{name}"


def dsn(url: str) -> str:
    """A libpq connection string from a SQLAlchemy URL (one host or several), as the services connect."""
    return psycopg.conninfo.make_conninfo(**db.connect_kwargs(url))


def admin_dsn() -> str:
    return dsn(database_url("postgres"))


class Cleanup:
    """Undo steps run last-in first-out, each at most once, whatever fails."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], None]]] = []

    def push(self, what: str, step: Callable[[], None]) -> None:
        self._steps.append((what, step))

    def run(self) -> None:
        """Run every step, each whatever became of the others.

        A step that fails, or is interrupted (a second Ctrl-C, a SIGTERM while cleaning up), does not keep the
        others from running: engines and services left behind would outlive the run.
        """
        while self._steps:
            what, step = self._steps.pop()
            try:
                step()
            except BaseException as error:  # keep cleaning up the rest
                print(f"bench: clean-up step {what!r} failed: {error!r}", file=sys.stderr)

    @contextlib.contextmanager
    def scope(self) -> Iterator[Cleanup]:
        """Run the steps pushed inside the block when it ends, however it ends."""
        depth = len(self._steps)
        try:
            yield self
        finally:
            while len(self._steps) > depth:
                what, step = self._steps.pop()
                try:
                    step()
                except Exception as error:
                    print(f"bench: clean-up step {what!r} failed: {error}", file=sys.stderr)


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt, so `finally` blocks clean up as on Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stage_database(cleanup: Cleanup, name: str, pool_size: int) -> sa.Engine:
    """A scratch stage database `name` (the lyric service's migrations) and an engine on it, both gone at clean-up."""
    url = database_url(name)
    lyric = next(database for database in stack.DATABASES if database.service == "lyric")
    migrations.drop_database(url)
    migrations.ensure_database(url)
    cleanup.push(f"drop {name}", lambda: migrations.drop_database(url))
    migrations.upgrade(url, lyric.migrations_dir)
    engine: sa.Engine = db.make_engine(url, pool_size=pool_size)
    cleanup.push(f"dispose the engine on {name}", engine.dispose)
    return engine
