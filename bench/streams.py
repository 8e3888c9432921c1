"""What idle event streams cost one gateway process.

Its CPU and memory while 2,000 streams stay open and nothing changes, with the code before streams waited for the
listener alone, and with this tree's.

A scratch database migrated as the gateway's holds `--pipelines` running pipelines and an admin key. A
gateway process serves its HTTP API and its listener (as the gateway's own process does, without the
consumer of stage events) on 127.0.0.1 with its default settings but for the streams a key may hold; this
process opens `--streams` event streams of those pipelines (/v1/pipelines/{id}/events, spread evenly) on
raw sockets and reads what comes. Once every stream is open and `--settle-s` passed, the gateway's CPU time
(from /proc) is read over `--window-s`, its resident memory before the streams opened and after, and the
scratch database's transactions meanwhile (pg_stat_database: the streams' reads, and this script's few
look-ups). The code before is run from a temporary checkout of `--before` (bench/webhooks.py). Each
gateway is stopped and the database dropped at the end, whatever happens. Writes docs/reports/streams.md by
bench/templates/streams.md.j2, the measurements kept beside it in streams.json (`make bench-streams`; `--render`
writes the page again from them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

from castad_testkit import machine, scratch

from bench import pages, webhooks

OPENING_AT_ONCE = 100  # streams being opened at the same time
TICKS_S = os.sysconf("SC_CLK_TCK")


def serve(database_url: str, port: int, per_key: int) -> None:
    """The gateway's HTTP API and listener on 127.0.0.1:`port` (the gateway on the path), until SIGTERM."""
    import uvicorn
    from castad_api import app, deps, notifications
    from castad_api import settings as api_settings
    from castad_runtime import db

    try:
        from castad_runtime.artifacts.volume import VolumeStore
    except ImportError:  # the release measured "before" kept every store in the module castad_runtime.artifacts
        from castad_runtime.artifacts import VolumeStore  # type: ignore[attr-defined,no-redef]

    config = api_settings.ApiSettings(database_url=database_url, sse_streams_per_key=per_key)
    with tempfile.TemporaryDirectory(prefix="castad-bench-streams-") as files:
        gateway = deps.Gateway(
            config=config,
            engine=db.make_engine(database_url, pool_size=8),
            notifications=notifications.PipelineNotifications(database_url),
            store=VolumeStore(pathlib.Path(files)),
        )

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> AsyncIterator[None]:
            gateway.notifications.start()
            try:
                yield
            finally:
                await gateway.notifications.stop()

        server = uvicorn.Config(
            app.create_app(gateway, lifespan), host="127.0.0.1", port=port, log_level="warning", backlog=4096
        )
        uvicorn.Server(server).run()


def prepare(url: str, pipelines: int) -> tuple[str, list[str]]:
    """A migrated scratch database with `pipelines` running pipelines and an admin key: the key, the ids."""
    import sqlalchemy as sa
    from castad_api import keys
    from castad_local import stack
    from castad_runtime import migrations

    migrations.ensure_database(url)
    migrations.upgrade(url, next(d.migrations_dir for d in stack.DATABASES if d.service == "api"))
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            ids = conn.scalars(
                sa.text(
                    "INSERT INTO pipelines (id, idempotency_key, request_hash, brief, status, current_stage)"
                    " SELECT gen_random_uuid(), 'bench-' || n, 'bench',"
                    " jsonb_build_object('customer_name', 'Cafe ' || n, 'region', 'Busan'), 'RUNNING', 'lyric'"
                    " FROM generate_series(1, :n) AS n RETURNING id"
                ),
                {"n": pipelines},
            ).all()
            key = keys.create(conn, "bench", frozenset({keys.Scope.ADMIN}), "streams benchmark").key
    finally:
        engine.dispose()
    return key, [str(pipeline_id) for pipeline_id in ids]


def transactions(url: str) -> int:
    import psycopg

    with psycopg.connect(scratch.dsn(url)) as conn:
        name = conn.info.dbname
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S  # utime, stime


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Streams:
    """Event streams opened on raw sockets, each read (and its bytes dropped) until it is closed."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key
        self.opened = 0
        self.open = 0
        self.refused: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.StreamWriter] = []

    async def open_all(self, paths: list[str]) -> None:
        gate = asyncio.Semaphore(OPENING_AT_ONCE)
        await asyncio.gather(*(self._open(path, gate) for path in paths))

    async def _open(self, path: str, gate: asyncio.Semaphore) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n"
                "Accept: text/event-stream\r\n\r\n".encode()
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            status = head.split(b" ", 2)[1].decode()
            if status != "200":
                self.refused.append(status)
                writer.close()
                return
            self.opened += 1
            self.open += 1
            self._writers.append(writer)
            self._tasks.append(asyncio.create_task(self._drain(reader)))

    async def _drain(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.open -= 1

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def measure(
    url: str, key: str, ids: list[str], tree: pathlib.Path | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Open the streams on a gateway of `tree` (None: this tree's) and read what they cost while idle."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.streams", "--serve", url, "--port", str(port), "--streams", str(args.streams)]
    server = subprocess.Popen(argv, cwd=scratch.REPO_ROOT, env=webhooks.with_code_of(tree))
    streams = Streams(port, key)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the gateway ended at once ({server.returncode})")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not listen within 60 s")
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # its listener connects
        memory_before = rss_mib(server.pid)
        started = time.monotonic()
        paths = [f"/v1/pipelines/{ids[n % len(ids)]}/events" for n in range(args.streams)]
        await asyncio.wait_for(streams.open_all(paths), args.window_s + 120)
        opening_s = time.monotonic() - started
        await asyncio.sleep(args.settle_s)
        cpu_0, xacts_0, wall_0 = cpu_s(server.pid), transactions(url), time.monotonic()
        await asyncio.sleep(args.window_s)
        cpu_1, xacts_1, wall_1 = cpu_s(server.pid), transactions(url), time.monotonic()
        window = wall_1 - wall_0
        return {
            "streams": args.streams,
            "opened": streams.opened,
            "refused": streams.refused[:5],
            "opening_s": round(opening_s, 1),
            "cpu_share": round((cpu_1 - cpu_0) / window, 4),
            "window_s": round(window, 1),
            "memory_before_mib": round(memory_before, 1),
            "memory_after_mib": round(rss_mib(server.pid), 1),
            "transactions_per_s": round((xacts_1 - xacts_0) / window, 1),
            "still_open": streams.open,
        }
    finally:
        await streams.close()
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/streams.md.j2 from the measurements."""
    return pages.render("streams.md.j2", **measured)


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("streams", __doc__)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait once every stream is open")
    parser.add_argument("--window-s", type=float, default=30.0, help="how long the idle streams are measured")
    parser.add_argument("--before", default=webhooks.BEFORE, help="the commit of the code before")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # a gateway on this database (a child process)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.port, args.streams)
        return 0
    measured: dict[str, Any] | None = None
    if not args.render:
        url = scratch.database_url(f"castad_bench_streams_{scratch.RUN_ID}")
        cleanup = scratch.Cleanup()
        with scratch.interrupt_on_sigterm(), cleanup.scope():
            from castad_runtime import migrations

            cleanup.push("drop the scratch database", lambda: migrations.drop_database(url))
            key, ids = prepare(url, args.pipelines)
            with webhooks.checkout(args.before) as tree:
                before = asyncio.run(measure(url, key, ids, tree, args))
            after = asyncio.run(measure(url, key, ids, None, args))
        measured = {
            "date": dt.date.today().isoformat(),
            "streams": args.streams,
            "pipelines": args.pipelines,
            "window_s": args.window_s,
            "before_commit": args.before,
            "before": before,
            "after": after,
            "facts": machine.facts(),
        }
    pages.write(args.output, render, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
