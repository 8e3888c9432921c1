"""Waking the relay at 32 writers.

Commits a second with no wake-up, with a NOTIFY inside each writing transaction (as the outbox's trigger did), with
one after the commit on the writer's connection, and with the waker (castad_runtime.wakeups); and how long after a
commit a listener hears of it.

The commit rates are bench.notify's variants at `WRITERS` threads (the benchmark's own part C runs them at
8), `ROUNDS` rounds interleaved; then `PROBES` single commits, `PROBE_GAP_S` apart, timed from the commit's
return to the listener hearing of it. Written to docs/reports/wakeups.md by bench/templates/wakeups.md.j2, the
measurements kept beside it in wakeups.json (`make bench-wakeups`; `--render` writes the page again from them).
The target (issue 37): the waker within 10% of no wake-up at all.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from castad_runtime import db, migrations, tables, wakeups
from castad_testkit import latency, machine, scratch

from bench import notify, pages

WRITERS = 32
PER_WRITER = 150  # transactions per writer and round
ROUNDS = 3
PROBES = 200
PROBE_GAP_S = 0.01
TARGET = 0.10  # the waker's commits a second at most this far below no wake-up's


def wake_latency_ms(variant: str, cleanup: scratch.Cleanup) -> list[float]:
    """From each commit's return to a listener hearing of it, one commit at a time."""
    url = scratch.database_url(f"castad_bench_{scratch.RUN_ID}_wake_{variant}")
    with cleanup.scope():
        migrations.drop_database(url)
        migrations.ensure_database(url)
        cleanup.push("drop the latency database", lambda: migrations.drop_database(url))
        engine = db.make_engine(url, pool_size=1)
        cleanup.push("dispose its engine", engine.dispose)
        cleanup.push("stop the wakers", wakeups.close_all)
        tables.outbox.create(engine)
        notify._prepare(engine, variant)  # noqa: SLF001 (the trigger of in_transaction)
        delays = []
        with psycopg.connect(scratch.dsn(url), autocommit=True) as listener:
            listener.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
            for _ in range(PROBES):
                notify._transaction(engine, variant, notify._row())  # noqa: SLF001
                committed = time.perf_counter()
                for _ in listener.notifies(timeout=1.0, stop_after=1):
                    delays.append((time.perf_counter() - committed) * 1000)
                time.sleep(PROBE_GAP_S)
    return delays


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/wakeups.md.j2 from the measurements."""
    rates = measured["rates"]
    met = rates["waker"]["rate"] >= (1 - measured["target"]) * rates["none"]["rate"]
    return pages.render("wakeups.md.j2", **measured, met=met)


def measure() -> dict[str, Any]:
    """Measure each variant's commit rate and how soon its waker is heard; return what the page is written from."""
    load = machine.load()
    cleanup = scratch.Cleanup()
    with scratch.interrupt_on_sigterm():
        rates = notify.run(WRITERS, PER_WRITER, ROUNDS, cleanup)["totals"]
        delays = {variant: wake_latency_ms(variant, cleanup) for variant in notify.VARIANTS if variant != "none"}
    return {
        "facts": machine.brief_facts(load),
        "writers": WRITERS,
        "per_writer": PER_WRITER,
        "rounds": ROUNDS,
        "probes": PROBES,
        "probe_gap_s": PROBE_GAP_S,
        "target": TARGET,
        "rates": {variant: {"rate": got["rate"], "round_rates": got["round_rates"]} for variant, got in rates.items()},
        "heard": {variant: latency.summary(found) for variant, found in delays.items() if found},
    }


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("wakeups", __doc__)
    args = parser.parse_args(argv)
    pages.write(args.output, render, None if args.render else measure())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
