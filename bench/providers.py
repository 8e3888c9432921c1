"""`make bench-providers` (`python -m bench.providers`).

Many pipelines through the three network providers at once, the music API slow, every stage service with 2 worker
threads; writes docs/reports/providers.md by bench/templates/providers.md.j2, the measurements kept beside it in
providers.json (`--render` writes the page again from them).

The providers are the fake servers of castad_local.fakes, in this process, on 127.0.0.1: a Chat
Completions server, a Suno-shaped music API taking `--song-s` per song, Creatomate's render API
taking `--render-s` per video; both call the gateway back when their work is done. The services
are the harness's installation of bench.castad_bench (own databases, namespace, processes), with
the network providers set in their environment. While the pipelines run, a sampler reads every
0.5 s: threads and open sockets of each service's processes (/proc), connections per database
(pg_stat_activity), and jobs AWAITING or RUNNING in each stage. At the end it checks what the
pipelines came to: every one SUCCEEDED, one attempt per stage, one submit per song and video.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import os
import pathlib
import secrets
import sys
import threading
from typing import Any

import psycopg
from castad_local.fakes import chat, creatomate, suno
from castad_runtime import links
from castad_testkit import scratch
from pydantic import SecretStr

from bench import castad_bench, cpu, pages

SAMPLE_S = 0.5


@dataclasses.dataclass
class Peaks:
    threads: dict[str, int] = dataclasses.field(default_factory=dict)
    sockets: dict[str, int] = dataclasses.field(default_factory=dict)
    connections: dict[str, int] = dataclasses.field(default_factory=dict)
    awaiting: dict[str, int] = dataclasses.field(default_factory=dict)
    running: dict[str, int] = dataclasses.field(default_factory=dict)

    def note(self, field: str, key: str, value: int) -> None:
        table = getattr(self, field)
        table[key] = max(table.get(key, 0), value)


def _threads_and_sockets(pids: list[int]) -> tuple[int, int]:
    threads = sockets = 0
    for pid in pids:
        try:
            threads += len(os.listdir(f"/proc/{pid}/task"))
            sockets += sum(1 for fd in os.scandir(f"/proc/{pid}/fd") if os.readlink(fd.path).startswith("socket:"))
        except OSError:  # the process ended meanwhile
            continue
    return threads, sockets


class Sampler(threading.Thread):
    def __init__(self, bench: castad_bench.CastadBench) -> None:
        super().__init__(name="sampler", daemon=True)
        self.bench = bench
        self.peaks = Peaks()
        self._halt = threading.Event()

    def run(self) -> None:
        assert self.bench.stack is not None
        with psycopg.connect(scratch.admin_dsn(), autocommit=True) as admin:
            urls = {stage: scratch.dsn(self.bench.urls[stage]) for stage in ("song", "video")}
            stage_conns = {stage: psycopg.connect(url, autocommit=True) for stage, url in urls.items()}
            try:
                while not self._halt.wait(SAMPLE_S):
                    self._sample(admin, stage_conns)
            finally:
                for conn in stage_conns.values():
                    conn.close()

    def _sample(self, admin: psycopg.Connection, stage_conns: dict[str, psycopg.Connection]) -> None:
        assert self.bench.stack is not None
        for name, process in self.bench.stack.processes.items():
            pids = list(cpu.snapshot(cpu.in_group(process.pid)))
            threads, sockets = _threads_and_sockets(pids)
            self.peaks.note("threads", name, threads)
            self.peaks.note("sockets", name, sockets)
        prefix = f"castad_bench_{scratch.RUN_ID}_"
        for database, count in admin.execute(
            "SELECT datname, count(*) FROM pg_stat_activity WHERE datname LIKE %s GROUP BY datname", (prefix + "%",)
        ):
            self.peaks.note("connections", database.removeprefix(prefix), count)
        for stage, conn in stage_conns.items():
            for status, count in conn.execute(
                "SELECT status, count(*) FROM jobs WHERE status IN ('AWAITING', 'RUNNING') GROUP BY status"
            ):
                self.peaks.note("awaiting" if status == "AWAITING" else "running", stage, count)

    def stop(self) -> None:
        self._halt.set()
        self.join()


class ProvidersBench(castad_bench.CastadBench):
    def __init__(self, cleanup: scratch.Cleanup, workdir: pathlib.Path, fakes: dict[str, Any]) -> None:
        super().__init__(cleanup, workdir)
        self.fakes = fakes
        self.link_secret = secrets.token_hex(32)  # the same for every service of the run

    def env(self) -> dict[str, str]:
        chat_, suno_, render = self.fakes["chat"], self.fakes["suno"], self.fakes["creatomate"]
        return {
            **super().env(),
            "CASTAD_API_LINK_SECRET": self.link_secret,  # and each signing stage its own key, derived from it
            **{
                f"CASTAD_{stage.value.upper()}_LINK_SECRET": links.stage_secret(
                    SecretStr(self.link_secret), stage
                ).get_secret_value()
                for stage in links.SIGNERS
            },
            "CASTAD_LYRIC_PROVIDER": "openai",
            "CASTAD_LYRIC_OPENAI_BASE_URL": f"{chat_.url}/v1",
            "CASTAD_LYRIC_OPENAI_API_KEY": chat.DEFAULT_KEY,
            "CASTAD_SONG_PROVIDER": "suno",
            "CASTAD_SONG_SUNO_BASE_URL": suno_.url,
            "CASTAD_SONG_SUNO_API_KEY": suno.DEFAULT_KEY,
            "CASTAD_VIDEO_PROVIDER": "creatomate",
            "CASTAD_VIDEO_CREATOMATE_BASE_URL": render.url,
            "CASTAD_VIDEO_CREATOMATE_API_KEY": creatomate.DEFAULT_KEY,
            "CASTAD_VIDEO_CREATOMATE_TEMPLATE_ID": "castad-bench",
            # The fakes listen on 127.0.0.1, over http.
            **{f"CASTAD_{stage.upper()}_ALLOW_PRIVATE": "true" for stage in castad_bench.STAGES},
            **{f"CASTAD_{stage.upper()}_GATEWAY_URL": self.base_url for stage in ("song", "video")},
            **{f"CASTAD_{stage.upper()}_CONCURRENCY": "2" for stage in castad_bench.STAGES},
            **{f"CASTAD_{stage.upper()}_QUOTA_RATE_PER_S": "50" for stage in castad_bench.STAGES},
            **{f"CASTAD_{stage.upper()}_QUOTA_BURST": "20" for stage in castad_bench.STAGES},
        }

    def outcomes(self) -> dict[str, Any]:
        """Per stage: jobs, attempts and their outcomes, jobs not SUCCEEDED."""
        found: dict[str, Any] = {}
        for stage in castad_bench.STAGES:
            with psycopg.connect(scratch.dsn(self.urls[stage]), autocommit=True) as conn:
                jobs = conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
                attempts = conn.execute("SELECT outcome, count(*) FROM attempts GROUP BY outcome").fetchall()
                completed = conn.execute(
                    "SELECT count(*) FROM outbox WHERE routing_key = %s", (f"{stage}.completed",)
                ).fetchone()
            assert completed is not None  # count(*) returns a row
            found[stage] = {"jobs": dict(jobs), "attempts": dict(attempts), "completed_events": completed[0]}
        return found


def run(args: argparse.Namespace, workdir: pathlib.Path) -> dict[str, Any]:
    fakes = {
        "chat": chat.FakeChat().start(),
        "suno": suno.FakeSuno(song_s=args.song_s, audio_s=4.0).start(),
        "creatomate": creatomate.FakeCreatomate(render_s=args.render_s).start(),
    }
    try:
        with scratch.Cleanup().scope() as cleanup:
            bench = ProvidersBench(cleanup, workdir, fakes)
            bench.setup()
            bench.start()
            sampler = Sampler(bench)
            sampler.start()
            try:
                measured = bench.throughput(
                    args.pipelines, args.concurrency, first=0, timeout_s=args.timeout_s, count_commits=False
                )
            finally:
                sampler.stop()
            return {
                "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "args": vars(args) | {"output": str(args.output)},
                "throughput": measured,
                "peaks": dataclasses.asdict(sampler.peaks),
                "outcomes": bench.outcomes(),
                "provider_requests": {name: _requests(fake) for name, fake in fakes.items()},
                "callbacks": {name: _callbacks(fake) for name, fake in fakes.items() if name != "chat"},
            }
    finally:
        for fake in fakes.values():
            fake.stop()


def _requests(fake: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in fake.received:
        if not isinstance(request, dict) or "path" not in request:  # the chat fake keeps bodies only
            key = "POST /v1/chat/completions"
        else:
            path = "/v2/renders/{id}" if request["path"].startswith("/v2/renders/") else request["path"]
            key = f"{request['method']} {path}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _callbacks(fake: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sent in fake.callbacks:
        key = f"{sent.get('callbackType')} → {sent.get('status') or sent.get('error')}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def findings(result: dict[str, Any], pipelines: int) -> list[str]:
    found = []
    for stage, seen in result["outcomes"].items():
        if seen["jobs"] != {"SUCCEEDED": pipelines}:
            found.append(f"{stage}: jobs {seen['jobs']}, not {pipelines} SUCCEEDED")
        if seen["completed_events"] != pipelines:
            found.append(f"{stage}: {seen['completed_events']} completed events for {pipelines} pipelines")
    submits = {
        "song": result["provider_requests"]["suno"].get("POST /api/v1/generate", 0),
        "video": result["provider_requests"]["creatomate"].get("POST /v2/renders", 0),
    }
    for stage, count in submits.items():
        if count != pipelines:
            found.append(f"{stage}: {count} submits to its provider for {pipelines} pipelines")
    return found


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/providers.md.j2 from the run's measurements and findings."""
    return pages.render("providers.md.j2", **measured)


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("providers", __doc__)
    parser.add_argument("--pipelines", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8, help="submissions in flight at once")
    parser.add_argument("--song-s", type=float, default=30.0)
    parser.add_argument("--render-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    measured: dict[str, Any] | None = None
    if not args.render:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
        logging.getLogger("bench").setLevel(logging.INFO)
        workdir = (scratch.REPO_ROOT / "var" / "providers" / scratch.RUN_ID).resolve()
        with scratch.interrupt_on_sigterm():
            result = run(args, workdir)
        measured = {**result, "findings": findings(result, args.pipelines)}
    kept = pages.write(args.output, render, measured)
    for finding in kept["findings"]:
        print(f"finding: {finding}", file=sys.stderr)
    return 1 if kept["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
