"""`python -m bench.alone projection|stage`.

One service's hot path alone, one item at a time, to compare two versions of the code where the whole
installation's figures (A) vary from run to run by more than a change moves.

- `projection`: the gateway's projection of a pipeline's six stage events (`castad_api.projection.apply`, as its
  consumer calls it), per event.
- `stage`: a stage's trigger handled, its attempt run (instant work) and its success recorded
  (`castad_runtime.stage`: handlers, scheduler with two slots, runner), per job.

Each in a scratch database copied from the service's migrated one (`make setup` made it; dropped at the end), in
this process: no broker, no relay, no HTTP. Printed per item, for each of `--rounds` rounds and their median: CPU
of this process, CPU of its PostgreSQL backends, and wall time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from castad_api import creation, projection
from castad_contracts import api, brief, envelope, events
from castad_runtime import db, migrations
from castad_runtime.stage import cancellation, handlers, machine, outcomes, repository, runner, scheduler
from castad_testkit import scratch

from bench import castad_bench, cpu

LYRICS = events.Lyrics(
    title="Bench", language=brief.Language.ENGLISH, sections=(events.LyricSection(kind="verse", lines=("la",)),)
)
BRIEF = castad_bench.bench_brief(0)  # the benchmarks' first brief
MEDIA = {events.Stage.LYRIC: "text/plain", events.Stage.SONG: "audio/wav", events.Stage.VIDEO: "video/mp4"}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _stage_event(pipeline_id: str, stage: events.Stage, fact: events.StageFact) -> envelope.Envelope:
    common_fields: dict[str, Any] = {"pipeline_id": pipeline_id, "stage": stage, "job_id": "job", "attempt": 1}
    payload: events.Payload
    if fact == "started":
        payload = events.StageStarted(**common_fields, started_at=_now(), worker="bench")
    else:
        artifact = events.Artifact(uri=f"file:///{stage.value}", sha256="0" * 64, size=1, media_type=MEDIA[stage])
        fields = {**common_fields, "artifact": artifact, "completed_at": _now(), "brief": BRIEF}
        if stage is events.Stage.LYRIC:
            payload = events.LyricCompleted(**fields, lyrics=LYRICS)
        elif stage is events.Stage.SONG:
            payload = events.SongCompleted(**fields, lyrics=LYRICS, timed_lines=(), song_duration_s=1.0)
        else:
            payload = events.VideoCompleted(**fields, width=32, height=18)
    return envelope.wrap(payload, events.stage_event(stage, fact), f"/castad/{stage.value}")


def projection_round(engine: sa.Engine, count: int) -> tuple[int, Callable[[], None]]:
    """`count` pipelines accepted; the round projects their events."""
    with db.transaction(engine) as conn:
        ids = [
            str(
                creation.create(
                    conn,
                    api.PipelineRequest(customer_name="Bench Cafe", region="Busan"),
                    "bench",
                    str(uuid.uuid4()),
                    3600,
                ).pipeline_id
            )
            for _ in range(count)
        ]
    facts: tuple[events.StageFact, ...] = ("started", "completed")
    envelopes = [
        _stage_event(pipeline_id, stage, fact) for pipeline_id in ids for stage in events.STAGE_ORDER for fact in facts
    ]

    def run() -> None:
        for env in envelopes:
            projection.apply(engine, env, env.payload())

    return len(envelopes), run


class StageAlone:
    """A lyric stage's handlers, scheduler and runner with instant work, on `engine`."""

    def __init__(self, engine: sa.Engine) -> None:
        policy = machine.RetryPolicy(3, 0.05, 60.0, jitter=0.0)
        self.runner = runner.StageRunner(
            events.Stage.LYRIC,
            engine,
            self._work,
            events.LyricCompleted,
            runner.Limits(policy),
            "bench",
            rng=random.Random(0),
        )
        self.jobs = scheduler.JobScheduler(self.runner, concurrency=2, poll_s=0.5)
        self.handlers = handlers.StageHandlers(engine, self.runner, self.jobs)
        self._recorded = threading.Semaphore(0)
        count = self.runner._count

        def counted(outcome: outcomes.Outcome, polling: bool, attempt_s: float | None) -> None:
            count(outcome, polling, attempt_s)
            self._recorded.release()

        self.runner._count = counted  # type: ignore[method-assign]

    @staticmethod
    def _work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        artifact = events.Artifact(uri="file:///lyric.txt", sha256="0" * 64, size=1, media_type="text/plain")
        return outcomes.Output(artifact, {"lyrics": LYRICS})

    def one(self) -> None:
        """A trigger handled, and its attempt's outcome recorded."""
        request = events.PipelineRequested(pipeline_id=str(uuid.uuid4()), brief=BRIEF, requested_at=_now())
        self.handlers.on_trigger(envelope.wrap(request, events.PIPELINE_REQUESTED, "/castad/api"), request)
        if not self._recorded.acquire(timeout=30):
            raise TimeoutError("an attempt was not recorded within 30 s")

    def round(self, count: int) -> tuple[int, Callable[[], None]]:
        def handle() -> None:
            for _ in range(count):
                self.one()

        return count, handle


def measure(database: str, prepare: Callable[[], tuple[int, Callable[[], None]]]) -> tuple[float, float, float]:
    """(process CPU, PostgreSQL CPU, wall) in ms per item of one round."""
    items, run = prepare()
    backends = cpu.postgres_backends(database)
    before, server_before, started = time.process_time(), cpu.snapshot(backends), time.perf_counter()
    run()
    wall = time.perf_counter() - started
    process, server = time.process_time() - before, cpu.used(server_before, cpu.snapshot(backends))
    return process * 1000 / items, server * 1000 / items, wall * 1000 / items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.alone", description=__doc__)
    parser.add_argument("part", choices=("projection", "stage"))
    parser.add_argument("--items", type=int, default=300, help="pipelines (projection) or jobs (stage) per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    database = f"castad_alone_{scratch.RUN_ID}"
    url = scratch.database_url(database)
    cleanup = scratch.Cleanup()
    with cleanup.scope():
        cleanup.push(f"drop {database}", functools.partial(migrations.drop_database, url))
        migrations.ensure_database(url, template="castad_api" if args.part == "projection" else "castad_lyric")
        engine = db.make_engine(url, pool_size=6)
        cleanup.push("dispose of the engine", engine.dispose)
        prepare: Callable[[int], tuple[int, Callable[[], None]]]
        if args.part == "projection":
            prepare = functools.partial(projection_round, engine)
        else:
            stage = StageAlone(engine)
            stage.jobs.start()
            cleanup.push("stop the scheduler", stage.jobs.stop)
            prepare = stage.round
        measure(database, lambda: prepare(20))  # warm-up: prepared statements, caches
        rounds = []
        for number in range(1, args.rounds + 1):
            rounds.append(measure(database, lambda: prepare(args.items)))
            print(f"round {number}: process %.3f  postgres %.3f  wall %.3f ms per item" % rounds[-1])
        median = tuple(statistics.median(values) for values in zip(*rounds, strict=True))
        print(f"median ({args.part}): process %.3f  postgres %.3f  wall %.3f ms per item" % median)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
