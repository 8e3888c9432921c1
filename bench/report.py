"""The benchmark report (docs/reports/benchmarks.md) from one run's results."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from bench import paired

HANDOFF_P50_MS = 5.0
HANDOFF_P99_MS = 25.0

# A record of product changes made with this harness, and what they did (not regenerated).
CHANGES = """### Product changes measured with this harness (2026-11-23)

Measured as `python -m bench.run --only castad --idle 50 --pipelines 150`, the code before and
after the changes run alternately, three runs each, twice (once while other test suites ran,
load average 3 to 6; once starting from an idle machine that other suites joined, load 0 to 7);
medians of each set of three runs.

| | first set: before | after | second set: before | after |
|---|---|---|---|---|
| throughput (pipelines/s) | 9.6 | 10.9 | 11.8 | 10.9 |
| CPU per pipeline, all processes (ms) | 186 | 162 | 149 | 160 |
| stage handoff p50 / p99 (ms) | 9.7 / 18.0 | 9.7 / 19.5 | 9.0 / 16.1 | 9.2 / 16.3 |
| commit → NOTIFY seen p50 (ms) | 2.0 | 1.8 | 1.8 | 1.7 |
| handler start → attempt claimed p50, mean of the stages (ms) | 10.8 | 9.2 | 9.9 | 8.3 |
| idle end to end p50, projection (ms) | 134 | 140 | 124 | 132 |

- `castad_runtime/db.py`: the post-commit NOTIFY is one autocommit statement instead of BEGIN,
  SELECT pg_notify, COMMIT: two round trips fewer per outbox or projection transaction (in a
  single-writer loop, 0.85 instead of 0.92 ms of client CPU per transaction).
- `castad_runtime/stage/scheduler.py`: expired leases are looked for once per `poll_s` instead of
  on every wake-up; a wake-up (new job, finished attempt) used to cost a transaction of its own
  before the claim.
- `castad_api/app.py` (`_stream`): the event stream subscribes to notifications before reading the
  timeline; a projection committed between the read and the wait used to leave the client
  waiting for the next poll (`CASTAD_API_SSE_POLL_S`, 2 s). Seen once in 40 idle pipelines
  before the fix (client end to end 2.36 s against 0.53 s in the database).

Only the claim (1.6 ms sooner in both sets) and the NOTIFY (0.1 to 0.2 ms) moved the same way
twice; the throughput, CPU and end-to-end differences change sign between the sets and are
within the noise of this shared machine. None of the changes moved the handoff measurably."""


HOT_PATH_CHANGES = """### The hot path made cheaper (2026-11-24)

Castad as in A (`python -m bench.run --only castad`, 300 pipelines in the throughput run), before the
changes and after each of two steps, then a full run after them. The first three were run on the AMD
EPYC machine of the 2026-11-23 figures (DBOS there: 72.6 workflows/s, 15.6 ms of CPU, 16 commits), the
last on an Intel Xeon (DBOS there: 74.9 workflows/s, 17.5 ms); the load average during "after step 2"
was about 3, so its CPU figure is high.

| | before | after step 1 | after step 2 | full run after step 2 |
|---|---|---|---|---|
| throughput (pipelines/s) | 14.1 | 35.9 | 29.8 | 41.3 |
| CPU per pipeline, every process and PostgreSQL (ms) | 94.8 | 49.9 | 61 | 41.7 |
| commits per pipeline | 62.5 | 33 | 30 | 26.8 |
| idle stage handoff p50 / p99 (ms) | 6.2 / 12.9 | 4.4 / 8.7 | 3.9 / 8.5 | 3.2 / 5.8 |
| idle end to end p50 (ms) | 80.7 | 49.9 | 41.5 | 35.4 |

Step 1, what moved the figures (py-spy profiles of every process under load, `make profile`):
- statements on the hot paths (inbox, outbox, the stage machine's claims and saves, the gateway's
  projection and creation) as plain SQL with psycopg parameters through the SQLAlchemy connection
  (`castad_runtime.db.run`): SQLAlchemy's statement building, cache keys and result handling had
  been half of the CPU of the gateway and the stages;
- no pre-ping on the pools of the stages and the gateway's projection (a broken connection is still
  found: the consumer hands the message back uncounted and the pool drops the connection);
- NOTIFY from a trigger on the outbox and on the gateway's timeline, inside the writing transaction,
  instead of a statement of its own after the commit: one round trip and one commit fewer per write
  (C shows the cost: commits that notify are serialised, which matters only far above these rates;
  the whole pipeline was measured both ways and was faster with the trigger);
- the projection locks the pipeline's row, then reads its stages in a statement of its own (so that
  under READ COMMITTED it sees what the previous event's transaction committed).

Step 2: a trigger that finds a free slot claims its job and starts the attempt in its own transaction
(the inbox entry, the job, the attempt and the `started` event in one commit, instead of a commit for
the job and another for the claim); the gateway counts a key's creation and creates the pipeline in
one transaction. What did not move the figures: the relay returning early after a short batch (kept,
only after a full batch with nothing suspect) and larger relay batches for the drain (E stays at about
0.44× the raw publisher: the relay reads, publishes, waits for confirms and marks, 0.19 ms of its CPU
and 0.08 ms of PostgreSQL's per row).

Step 3 (2026-11-24, a slower 2-core Intel Xeon at 2.3 GHz). Castad before
the step and with spans dropped alone were run with `--only castad`, the drains with `--only drain`;
"after" is step 3's full run (A and E) and a second `--only castad --only dbos` run twenty minutes later.

| | before step 3 | spans dropped alone | after: step 3's full run | after: second run |
|---|---|---|---|---|
| throughput (pipelines/s) | 23.6 | 25.5 | 30.3 | 31.9 |
| CPU per pipeline, every process and PostgreSQL (ms) | 76.2 | 70.2 | 58.9 | 55.7 |
| idle end to end p50 (ms) | 58.7 | 74.6 | 52.0 | 54.0 |
| DBOS: workflows/s, CPU ms, idle p50 ms | 38.9, 36.1, 25.0 (own run) | | 61.9, 22.3, 20.0 | 55.0, 25.7, 20.0 |
| backlog drain, relay / raw aiormq (rows/s) | 1,900 / 4,572 (0.42×) | | 2,272 / 5,105 (0.45×) | |
| relay CPU per 1,000 drained rows (ms) | 315 | | 222 | |

Castad's own figures moved: a third more throughput, a quarter less CPU. The ratios to DBOS did not
cross a target, and DBOS's own figures moved by half between runs on this machine (38.9 to 61.9
workflows/s), more than Castad's did, so a ratio from one run is a rough figure here.

- PostgreSQL hands the relay each envelope as JSON text without its trace context, and the publish
  span's traceparent is spliced into that text: no JSONB parsed into Python and encoded again. The
  publish span is no longer made current only to read its context.
- Spans are recorded only where they are exported. Every run here sets `OTEL_TRACES_EXPORTER=none`, and
  spans were still built, given attributes and ended for nobody; the sampler now drops them, while
  trace ids still pass from hop to hop. "Spans dropped alone" is the code before step 3 with
  `OTEL_TRACES_SAMPLER=always_off`. Where traces are exported (the charts' `global.otel`), spans cost
  what they did before.
- A `Backoff` seeds its random generator at its first delay instead of when it is made:
  `outages.keep_trying` makes one around every handler and outcome and almost never waits (3% of a
  stage's CPU in `make profile`).
- Tried and dropped: reading the next batch while one is published. Reading "the rows after this
  batch" was fast (0.54× in one drain) but wrong: a row below that point that came due, was republished or
  committed late could be overtaken by a later row of its pipeline (a test now covers it). Reading
  from the oldest row but those in flight kept the order and gained nothing (0.40× and 0.41×, against
  0.44× without it in the drain run between them; PostgreSQL's CPU per row up by a third).
- The idle end to end varies from run to run on this machine by more than these changes could move it
  (58.7 and 74.6 ms in the first two columns, which differ only in spans nobody exports); the summary
  gives one run's.

Step 4 (2026-11-25, a 2-core AMD EPYC). Whole-installation runs (A) moved by
more than these changes between runs here: the code before step 4, run four times with `--only castad`,
gave 32.8 to 35.8 pipelines/s, 49.8 to 53.8 ms of CPU and 41.2 to 56.5 ms idle end to end. So each
change was measured alone with `python -m bench.alone` (one service's hot path in one process against a
scratch copy of its database, one item at a time), the code before step 4 and after it run alternately,
three times each, 300 items a round, medians of three rounds:

| per item (ms) | before step 4 | after |
|---|---|---|
| gateway projection, per event: process CPU | 0.97, 0.96, 1.04 | 1.00, 0.84, 0.89 |
| gateway projection, per event: PostgreSQL CPU | 0.70, 0.71, 0.70 | 0.63, 0.51, 0.54 |
| gateway projection, per event: wall | 1.88, 1.92, 1.96 | 1.51, 1.31, 1.35 |
| stage, per job: process CPU | 2.21, 2.19, 2.46 | 1.59, 1.43, 1.69 |
| stage, per job: PostgreSQL CPU | 1.13, 1.13, 1.30 | 1.00, 0.90, 1.00 |
| stage, per job: wall | 3.24, 3.26, 3.66 | 2.76, 2.45, 2.90 |

A pipeline has six projected events and three stage jobs: about 3.6 ms less CPU (2.3 in the services,
1.3 in PostgreSQL) and about 2 ms less on an idle pipeline's path (its three stages and the projection
of video.completed). That is within the spread of the whole installation's runs: in the first full run
after step 4 (A), 33.8 pipelines/s and 45.2 ms idle lie inside the range of the four runs before it, and
54.1 ms of CPU just above it; step 4's full run's 35.4 pipelines/s, 51.8 ms and 44.2 ms lie inside it. DBOS moved
more between those two full runs (54.8 and 71.6 workflows/s, 25.3 and 19.3 ms of CPU, 16.0 and 21.0 ms
idle) than Castad did.

- The projection sends the inbox row, the pipeline's lock and the read of its stages to PostgreSQL
  together, then its four writes together (psycopg's pipeline mode, `db.pipelined`): three round trips
  per event instead of nine. A SQLAlchemy statement inside such a block is refused, since SQLAlchemy
  reads a rowcount at once that pipeline mode gives later.
- A stage's scheduler looked for due work after every attempt, one transaction each that found nothing
  when jobs are claimed by their trigger. It now looks only when its last look left work for want of a
  slot, or when the attempt did not succeed.
- One heartbeat thread per stage service renews every running attempt's lease in one statement,
  instead of a thread and a transaction per attempt (started and joined around every attempt).
- The relay's marks commit without waiting for their WAL flush (`synchronous_commit` off for its
  session): a mark lost to a crash of the database only sends rows again, and inboxes drop those. A
  refusal, which may park a row, still commits durably. The drain did not move (its batches are full),
  as measured then, with the harness below that still loaded the machine during the drain.
- The drain's harness (E) read the whole outbox every 50 ms to see whether the relay was done, beside
  the relay on the same two cores, and that read was counted in the drain's PostgreSQL CPU. It now looks
  in the relay's own partial index. The same code drained 100,000 rows at 2,398 rows/s in the run before
  the fix, at 3,679 and 3,874 rows/s in two drains after it (3,413 in a third, with a profiler attached
  to the relay) and at 4,151 in step 4's full run. PostgreSQL's CPU went from 140 to 52-56 ms per 1,000 rows. The
  relay's code did not change for this.
- Also tried, no gain, not kept: the relay's publishes not waiting for their frames to be written
  (aiormq's `wait=False`; drains of 3,954 and 3,677 rows/s against 3,679 and 3,874), and a 0.5 ms GIL
  switch interval in every service (idle end to end 47.7 ms against 43.1 ms without it, in one
  `--only castad` run each). Timing an idle stage's steps showed where its 9 ms go: its trigger's
  transaction about 3.6 ms, the hand-over to a slot 0.6, the instant work 1.7 (a thread, the file, its
  sha256), the completing transaction 3 ms. In `bench.alone`, which runs jobs back to back, a whole job
  (both transactions and the work) takes 2.8 ms; at idle each round trip waits for processes woken from
  sleep.
- Tried and dropped: whole transactions in pipeline mode, BEGIN and COMMIT included. A stage's trigger
  and success waited for an answer after almost every statement, so pipeline mode only added its own
  work: per job 1.34-1.43 ms of process CPU before, 1.56-1.64 after (four runs each). The projection
  gained nothing more from it (0.85 against 0.84 ms per event).

Step 5 (2026-11-25, the same machine, busier than before: the code of step 4 gave 45.9 ms idle end to end
in the morning's first run and 50.8 to 62.9 ms in six runs later on).

- Tried and dropped: a stage's trigger sending its inbox row, the job's acceptance and its claim (the
  attempt opened by the same statement) before reading any answer, and its success sending the
  compare-and-set with its `completed` event (rolled back if the job had moved on): four round trips
  fewer on the trigger and one on the success, the transactions' own BEGIN and COMMIT left as they were.
  In `bench.alone stage` (500 jobs a round, alternating with the code before, twice each) a job took
  1.53 and 1.67 ms of process CPU against 1.57 and 1.69, 0.90 and 0.98 ms of PostgreSQL against 0.94
  and 1.04, 2.59 and 2.86 ms of wall time against 2.73 and 2.94. In the whole installation nothing moved
  beyond the spread of runs: idle end to end p50 61.5 and 55.8 ms against 55.4 and 62.9 (300 idle
  pipelines a run, alternating), 34.9 and 34.0 pipelines/s against 29.7 and 34.9. About 0.1 ms per job
  was not worth a speculative write in both of a stage's transactions.

Step 6 (2026-11-25, the same 2-core AMD EPYC). Here the same code gave 32 to 49 ms of CPU per pipeline
in runs of one afternoon, every process up or down together while a one-core calibration loop stayed
within 5%, so the steps were measured as alternating pairs of `--only castad` runs (400 pipelines, 40
idle), in a worktree of their own. Before and after the first seven changes below, four pairs:

| | before step 6 | after the first seven changes |
|---|---|---|
| throughput (pipelines/s) | 32.5, 35.0, 31.4, 39.0 | 44.0, 40.2, 45.6, 46.6 |
| CPU per pipeline, every process and PostgreSQL (ms) | 55.7, 53.3, 59.3, 46.8 | 40.7, 45.0, 38.7, 37.7 |
| of which api / relay / PostgreSQL, medians (ms) | 14.6 / 5.1 / 12.9 | 9.8 / 3.0 / 8.6 |
| commits per pipeline | 28.1, 28.2, 28.3, 28.3 | 12.8, 13.5, 13.1, 12.8 |
| idle end to end p50 (ms) | 42.5, 38.1, 59.8, 44.3 | 41.6, 43.7, 51.5, 53.8 |

The eighth (merged writes) against the seven before it, three pairs: 44.0, 45.5, 43.8 ms of CPU
against 37.6, 42.1, 36.5 (api 10.0-11.1 against 8.9-10.0 ms, PostgreSQL 9.1-9.6 against 8.0-9.0),
39.9-41.0 pipelines/s against 42.7-48.9. Idle end to end moved within the spread of runs throughout:
at idle nothing comes together, and every path an idle pipeline takes is the one it took before.

- Group commit in the gateway's projection (`castad_runtime.groups`): its consumer's threads hand their
  events to a Projector; an event that finds no transaction under way is projected at once, as before,
  and the events that come meanwhile are projected together in the next one: their inbox rows in one
  statement, their pipelines locked in the order of their ids, one commit. A group that fails is projected
  event by event, so only an event at fault fails. Eight consumer threads instead of four, so that up to
  seven events can wait for a group; each thread is woken only when its event is done or it is handed the
  lead. Commits of the gateway's database: 10.8 a pipeline before, 5.0 after.
- A group's writes merged per row (`castad_api.writes`): the last value of a column, the first start of a
  stage, an attempt's end as the single statement takes it; one multi-row statement a table and set of
  columns instead of four statements an event. Tests project the same stories one by one and together and
  compare every row.
- A stage's slot whose attempt ends claims the next job in the transaction that records the outcome,
  while work waits for a slot: under load every job had been claimed by a transaction of its own.
- The relay marks the rows RabbitMQ confirmed with the statement that reads its next rows (one statement
  a drain instead of two), or alone when no NOTIFY comes within `CASTAD_RELAY_MARK_DELAY_S` (20 ms).
  Commits of a stage's database: 5.8 a pipeline before, 2.6 after (its two transactions and the
  relay's looks). In a backlog this cost more than it saved: the look's SELECT still saw the rows being
  marked as unpublished and passed over them, and a full `make bench` run (`14140c3d`) showed the drain
  at 0.45× and PostgreSQL at 217 ms per 1,000 rows. Between the full batches of a backlog the marks are made alone
  again: in alternating `--only drain` pairs, 126 and 136 ms of PostgreSQL per 1,000 rows against 220 and
  199, the drain at 0.52× and 0.49× of the raw publisher against 0.42× and 0.48×.
- The gateway counts a key's creation last in the creation's transaction: counted first, the counter's
  row stayed locked across the whole creation and its commit, and every POST of the key waited for the
  one before (`pg_stat_statements`: 85 ms a call in the throughput run, 8 requests in flight). The
  throughput run's 400 POSTs were accepted in 4.9-6.6 s instead of 7.7-9.7 s.
- The gateway's dependencies that wait for nothing (its parts, the Content-Type check) are async: FastAPI
  had run each on a thread of its pool, two hops for every POST.
- Not kept: Dramatiq without the middleware Castad does not use (age and time limits, shutdown
  notices, callbacks, pipelines): 1.5 to 12 µs less per message through a stub broker, within the
  spread of that measurement. Not tried: grouping a stage's triggers like the projection's events. At
  50 pipelines/s a stage's trigger comes every 20 ms and its transaction takes about 1.5 ms, so nearly
  every group would be of one.

The two full runs at the end of step 6 (`14140c3d` before the drain's fix, and the run after it) came on a
slower host than the afternoon's: a PostgreSQL round trip took 0.14-0.20 ms back to back against 0.06 ms,
and DBOS did 35.5 and 36.5 workflows/s against 71.6 in the run of step 5. The ratios moved where step 6
aimed: commits per pipeline 26.8 → 12.8-13.1 (now fewer than DBOS's 16.2-16.3), CPU 2.68× → 1.60× and
2.03× of DBOS's, throughput 0.49× → 0.79× and 0.59×. The handoff p50 (5.3 and 6.5 ms) and the
10-minute run (worst minute's p99 1,416 and 260 ms against 227 and 114 ms in the first) missed targets
they had met on the faster host. Six-minute runs at one fixed rate (14 pipelines/s, alternating, on that
host) do not clear step 6 of the second: with its code p50 went from 52 to 100-112 ms by the third
minute and stayed (a second run: 74-130 ms), with the code before it 55-64 ms (one minute 91); the
machine's load average stayed at 4-5 on two cores throughout, so both ran at the edge of what the host
gave. Group commit trades a little latency (an event may wait for the group before it) for CPU, which
is the likely cost at that edge; it was not settled in this step.

Step 7 (2026-11-25, evening, the same machine) settled it, and it was not group commit. Five-minute runs
at a fixed 12 pipelines/s (`python -m bench.sustained`, about half the maximum then): the code of step 6
rose in three runs (p50 63 → 117, 72 → 118 and 97 → 277 ms by the fourth minute), the code before step 6
stayed flat in two (p50 63-73 and 70-78 ms). PostgreSQL's CPU rose with it (0.34 → 0.45 cores) while every
Castad process's stayed flat, and `pg_stat_activity` sampled every 10 ms put the relay's look for rows,
which since step 6 also marked the rows confirmed before it (`WITH marked AS (UPDATE ...) SELECT ...`),
from nowhere in the first minute to 6-8% of the samples of each stage database by the fourth. Timed in the
relay, that look's p50 went from 1.8 to 6.0 ms in five minutes; with the marks made by a statement of their
own and nothing else changed, it stayed at 1.6-2.6 ms. Why the one statement suffers more than the two
from the dead rows a run leaves was not found (this machine's PostgreSQL runs without autovacuum). The
relay now marks a batch's confirmed rows by themselves once the batch is settled, as before step 6, and
`CASTAD_RELAY_MARK_DELAY_S` is gone: a mark that waits for the next look only puts a round trip on that
look's path. The 10-minute run above stayed flat (p50 65-79 ms every minute, p99 91-114 ms but for one
minute at 169); commits per pipeline went from 12.8 to 14.2, the stage databases' marks being transactions
of their own again. This run came on the slowest host yet (DBOS 23.8 workflows/s; a round trip after 10 ms
idle 0.71 ms), so its other figures say little about the change.

Where an idle stage's time goes (step 7, timed inside the services, 40 idle pipelines): the relay's look
0.9-1.5 ms after its NOTIFY; 2.6-3.3 ms from its publish to the next service's actor, where a bare pika
consumer takes 1.2 ms and a bare Dramatiq actor 2.0 ms on the same broker; 1 ms from the actor to the
handler's BEGIN. In a stage: 3.2-5 ms for the trigger's transaction, 5-7 ms from its commit to the
outcome's transaction (0.6 the hand-over to a slot, 1.3 a provider thread started, 0.8 the instant work),
2.5-3 ms for that transaction. Every PostgreSQL round trip and thread hop on that path pays for waking a
sleeping process; the idle targets stay out of reach of small changes there.

Also in step 7: a POST whose key had already made its minute's pipelines did a whole creation before its
rollback; the key's count of the current minute now comes with its authentication (the same statement),
and such a POST is refused before any work. The count that decides stays last in the creation's
transaction.

Step 8 (2026-11-26) went after what the processes spend while nothing happens, and two costs paid per
statement or per log line. A stack at rest (20 s after 3 pipelines) used, every second, 21.4 ms of CPU in
the gateway, 16.4 in the relay and 11-13 in each stage. Two causes:
- Dramatiq's consumer and worker threads woke every 0.1 s to see whether their worker stopped (Castad had
  set `worker_timeout=100`; Dramatiq's default is a second). With a second: gateway 7.5, stages 4.5-5.0 ms
  a second at rest. A stop may take up to a second longer.
- psycopg's `notifies()` waits in turns of 0.1 s, so each LISTENing connection woke its event loop ten
  times a second: the relay has one per source database (strace: 80 epoll waits a second at rest), the
  gateway one for its event streams. Listeners now sleep until their socket is readable
  (`castad_runtime.db.notifications`): relay 2.6 ms a second at rest.

Under load, the gateway's merged projection writes sent their rows as one array per column, which
psycopg dumps value by value in Python: 8% of the gateway's samples in a py-spy profile with native
frames. (Without native frames py-spy put that time in a list comprehension of 4 µs: on Python 3.11 its
attribution next to C code is not to be trusted.) Each statement now takes its rows as one JSONB
document, read back by `jsonb_to_recordset` with the table's column types (3 rows: 100 → 34 µs to dump).
And every log line went through four regular expressions that mask credentials (38 µs a line); each now
runs only on a line holding the words it needs (2.4 µs).

Three alternating pairs of `python -m bench.run --only castad` (300 pipelines) before and after these
changes: CPU per pipeline 101.8-103.8 → 92.1-96.4 ms, throughput 16.7-17.3 → 18.4-19.3 pipelines/s;
gateway 27.2-28.4 → 23.2-24.8 ms, each stage about 1 ms less, PostgreSQL 19.8-20.6 → 18.5-19.4; the relay
unchanged (8.5-9.4 and 8.9-9.2 ms: under load its listeners wake for NOTIFYs anyway), idle end to end
too (p50 93-111 and 99-110 ms). What each change gave under load was not measured apart. What is left
is mostly Dramatiq's RabbitMQ consumer: pika's loop is 26-31% of the samples of every Dramatiq service
(each message's frames decoded, its ack handed from the worker thread to the connection's thread and
flushed), the same path the plain Dramatiq peer pays for three messages a pipeline, where the gateway
takes six and each stage one.

The full run of step 8 (`a6f78d30`, a faster hour of the host: DBOS 26.1 workflows/s) met the CPU target
(1.45×), the idle end-to-end one (1.87×) and the handoff's p99 (12.3 ms); throughput came to 0.92×. Its
10-minute run kept p50 at 59-75 ms every minute, but p99 rose from 137 ms in the first minute to 1,571 and
1,042 ms in the fifth and sixth and 808 in the eighth. PostgreSQL's log has a timed checkpoint starting at
the end of the fifth minute and writing 43% of shared buffers over the next 4.5 minutes (the first
change of each page after a checkpoint writes the whole page to the WAL, which every commit then waits
for); that it caused the rise was not shown.

Step 9 (2026-11-26, on a faster host than step 8's: DBOS at 56-58 workflows/s against 26.1) looked at
three things, then made two full runs of the same services, half an hour apart. The first (`b1e42368`):
throughput 47.1 against DBOS's 56.2 (0.84×), CPU per pipeline 37.0 against 25.4 ms (1.46×), idle end to
end 44.4 against 17.0 ms (2.61×), stage handoff 4.3 / 7.3 ms, drain 0.63×, steady p99 87-168 ms (1.65× the
first minute's). The second (`76dd6275`): throughput 35.9 against 58.1 (0.62×), CPU 49.4 against 24.6 ms
(2.01×), idle end to end 51.0 against 21.0 ms (2.43×); in its part A every process used about a third
more CPU than in the first, RabbitMQ and PostgreSQL included, and the plain Dramatiq pipeline ran 750
messages/s against 1,090, while DBOS ran as fast as before: the host was busier for the processes that
talk through RabbitMQ, which is not a change of Castad's.
- Garbage collection. A `gc.callbacks` probe in every process over 1,000 pipelines: the stages and the
  relay ran no full collection under load, but the gateway, whose heap holds about 160,000 objects
  (150,000 of them from start-up), did, and each went over all of them: one pause of 220 ms in one run,
  380 ms in another, 0.31 s of collection in all. Each service now calls `gc.freeze()` once it has
  started: the longest pause under the same load was 15 ms, collection 0.11 s. Throughput and CPU per
  pipeline did not move beyond the noise (five runs each, before and after: 41.5-48.4 and 39.2-46.9
  pipelines/s, 35.9-43.2 and 37.5-46.1 ms; the slowest run after came with every process, PostgreSQL and
  RabbitMQ included, using more CPU).
- The handoff's own measurement. The harness's observers of a handoff's parts (the tap queue, a LISTEN
  per database, their threads) add work to the hops they time, so the idle part now times the totals on
  pipelines run without them and the parts on a second lot with them: over ten runs of 50 pipelines the
  stage handoff's p50 was 3.9-5.3 ms without the observers and 4.2-5.3 ms with them.
- The steady run's slow minutes. The run now records per minute what PostgreSQL did (checkpoints
  finished, full-page images and bytes written to the WAL, autovacuum runs) and the load average. In
  neither run did a minute's p99 follow a checkpoint or a burst of full-page images: in the first, p99
  was 87-168 ms with the worst minute (the eighth) having neither; in the second 46-107 ms, the worst (the
  tenth) with a checkpoint but the fifth, with one too, at 48 ms. Both missed 1.5× of their first
  minute, by 1.65× and 1.73×: a tail of about 1% of a minute's pipelines moves by tens of milliseconds
  from minute to minute on this host. Autovacuum is off on this machine's PostgreSQL (`SHOW
  autovacuum`), so that column reads 0.

Where a stage's idle time goes: the table "Inside a stage" in A now splits it with the databases'
clocks. Probes in the stage runner (30 pipelines, p50 per stage) split it further: the handler's
transaction (inbox row, job, claim, `started` event) 2.3 ms to its COMMIT and 0.7 ms more to return, 0.8
ms until a thread of the scheduler's pool starts the attempt, 0.3 ms until the provider's own thread
runs, 1.1 ms of work with an instant provider (the input validated, the artifact written, hashed and
renamed), 2.5 ms for the transaction that records the outcome and its `completed` event: 7.6-7.8 ms in
all, about 24 of an idle pipeline's 44 ms in the first run, which DBOS ran in 17 ms. Setting Python's
switch interval to 0.5 ms did not change it (two pairs of runs).

Step 10 (2026-11-26, later; the host an Intel Xeon this time) measured the host before anything else:
run alone (`--only castad`, the same code, 100-200 pipelines), Castad used 34 ms of CPU a pipeline in one
run and 61 ms in another about twenty minutes later, and its idle end to end went from 40 to 63 ms. Run
one after the other, A and D each took such a stretch of their own, so step 9's two runs set 0.84× and
0.62× against each other for the same code.
- A and D now run side by side (*Paired rounds* above, `bench/paired.py`): both installations up at once,
  a throughput run of each that counts the commits and warms it up under load, then five rounds of a
  throughput run and an idle lot of each, who goes first alternating; the targets that are ratios to DBOS
  stand on the median of the ratios within rounds. Two full runs half an hour apart, the host slower in
  the second (DBOS at 58.5-70.6 workflows/s across the rounds of the first, 48.3-53.8 in the second,
  run 919dab86): throughput 0.71× and 0.71× at the median (rounds 0.63-0.82× and 0.66-0.76×), CPU per
  pipeline 1.81× and 1.88× (1.65-2.00×, 1.77-1.96×), idle end to end 2.23× and 2.25× (2.15-2.66×,
  2.22-2.55×). None of the three is met, and none moved with the host as step 9's single runs did. The
  first run counted commits within its first round, which set that round's two runs 45 s apart and made
  it Castad's slowest (0.63×); the counting now has a run of its own before the rounds. Castad's
  PostgreSQL CPU is now that of its own four databases by name: the prefix it had also took in the DBOS
  database once both ran.
- Tried, not kept: a trigger's handler waiting, at most 5 ms, until its attempt's work had ended before it
  wound down, so that the message's acknowledgement, the span's end and Dramatiq's bookkeeping would not
  take the GIL from the attempt. Inside each stage the outcome's recording began sooner after the
  `started` commit (3.7 ms against 5.2-5.4, p50), but the recording itself then took longer, and over five
  alternating pairs of 80 idle pipelines idle end to end was 50.6-57.7 ms against 46.4-63.2: nothing beyond
  the host's drift. Waiting only until the work had begun was no better (two pairs).
- The other targets, measured on one side at a time, still move with the host: stage handoff p50 4.7 and
  5.4 ms (target 5), the drain 0.51× and 0.47× of the raw publisher (target 0.5×). The steady run of the
  first missed (p99 97-380 ms, 1.74× its first minute), its slowest minutes, the fifth and sixth (361 and
  380 ms), those where a timed checkpoint of PostgreSQL ended and the next began (about 1,250 full-page
  images each); the second, at a lower rate (half of a slower peak), met it (53-73 ms, 1.07×) with the
  same checkpoints and full-page images in its fifth and tenth minutes. What a checkpoint does to the
  commits beside it on this host was not measured apart.

Step 11 (2026-11-26, a later session; the host an Intel Xeon again).
- The drain (E) runs in rounds too: the relay's drain and the raw publish alternate, who goes first
  alternating, three rounds by default (`--drain-rounds`), the outbox emptied between them, and the target
  stands on the median of the ratios within rounds. Single drains of the same relay code had given 0.47×,
  0.51× and, in an `--only drain` run at the start of this step, 0.60×; run 800871c4's rounds 0.55-0.60×.
- Pairing does not take out all of the host: run 800871c4's rounds set Castad at 0.57× of DBOS's
  throughput at the median, against 0.71× in both full runs of step 10, with the same Castad code. Across
  its rounds DBOS went from 41.6 to 73.5 workflows/s and from 32.5 to 19.4 ms of CPU a workflow, while Castad
  went from 32.7 to 38.0 pipelines/s and from 55.4 to 46.3 ms: as the host sped up (Castad's idle end to
  end fell from 74.0 to 44.8 ms over the same rounds), DBOS's one process, which used about 1.4 of the 2
  cores, gained far more than Castad's five, which used 1.8 throughout.
- What a POST waits for. `pg_stat_statements` over a throughput run (300 pipelines, 8 POSTs in flight,
  one key): every statement on a pipeline's path took 0.01-0.4 ms a call, but the count of the key's
  creation 75 ms. The count is one row per key and minute, locked by each creation until its transaction
  ends; counted last in the creation's transaction (step 6), the lock is still held from the count's
  answer to the COMMIT, a few milliseconds in a gateway whose threads take turns at the GIL, and the eight
  POSTs queue behind it. As a bound, the gateway with no count at all (not a change one could keep): six
  paired rounds (two installations up at once, alternating) gave 36.3 against 33.3 pipelines/s and 48.9
  against 53.6 ms of CPU at the median, the 300 POSTs accepted in 3.5-4.9 s against 5.0-6.0, but in four
  of the six rounds the two were within each other's noise. Tried, not kept: the count as a statement of
  its own before the creation's transaction, committed at once (the row then locked only while
  PostgreSQL runs the statement and its commit), counting only while the minute has room and given back
  when nothing was created (a replay, a conflict, a failure). The limit held exactly (twelve creations at
  once against a limit of five: five slots), but six paired rounds gave 33.9 against 34.3 pipelines/s and
  51.9 against 51.7 ms of CPU, the POSTs accepted in 4.1-5.1 s against 4.8-5.9: a commit more a pipeline
  for no target's figure.
- Tried, not kept: Python's switch interval at 1 ms and at 0.2 ms in every service (5 ms by default), so
  that a thread woken by its socket takes the GIL sooner from a busy one. Three installations up at once,
  24 rounds of 20 idle pipelines each, who goes first rotating: idle end to end p50 67.4 and 68.3 ms
  against 68.5 at the median, the 1 ms one faster in 15 rounds of 24 (by 1.1 ms at the median), the 0.2
  ms one in 11. A shorter pairing before it (eight rounds, a throughput run after each idle lot) had put
  the 1 ms one at 58.7 against 66.3 ms; the longer one did not bear that out.
- The steady run (F) of run 800871c4 missed on one minute: its seventh minute's p99 was 333 ms against 87 ms
  in the first, while p50 stayed at 39-50 ms every minute. No checkpoint ended in that minute and it
  wrote few full-page images (158); the fifth and sixth, with a checkpoint's end and 1,229 and 750 of
  them, had a p99 of 69 ms.

Step 12 (2026-11-26, a later session; the same Intel Xeon). No change to a pipeline's path: a stage's
scheduler now lets no trigger claim its job before the scheduler's first look (at a start, retries and
jobs accepted while the service was down may be due, and a trigger had been able to run its new job
ahead of them); once that look is done, a trigger claims as before. Run 0bae30e0, the fourth paired
run of the same hot path, puts Castad at 0.69× of DBOS's throughput, 1.85× its CPU and 2.54× its idle
end to end at the median of the rounds (0.71×, 0.71× and 0.57×; 1.81×, 1.88× and 2.19×; 2.23×, 2.25× and
2.38× in the three before), the drain at 0.65× (0.57× before). The steady run missed by far: p99 148 ms
in the first minute, 851 and 1,618 ms in the fifth and sixth, where a checkpoint ended and 1,521 and 911
full-page images were written, and 480-760 ms after them, while the machine's load average rose from 3.2
to 5.9 at a rate (half of this run's median round, 37.0 pipelines/s) that the same code had held at
1.07× in step 10's second run at half of a slower peak. Whether Castad or the host fell behind over those
minutes (the disk's flushes under 50-65 MB of WAL a minute, or the machine's share of its cores) was not
measured apart.

Step 13 (2026-11-26, a later session; the same Intel Xeon) measured it apart. F now records, per minute,
the share of the machine's CPU time that was busy, waiting for I/O or stolen, each process's CPU, and where
the minute's slowest pipelines spent their time, part by part (the tables of F above). Two 10-minute runs
at 18.5 pipelines/s on the code of step 12: p99 from 78 to 153 ms and from 85 to 173 ms (1.96× and
2.04×), iowait 1-2% and steal 0 in every minute, so neither the disk nor the hypervisor. Of the parts, only
the last grew, from the video stage's end to the gateway's projection of it (9-15 ms in the first minutes,
25-100 ms later), while each stage and each handoff between stages stayed flat; PostgreSQL's CPU rose from
14.6 to 22 s a minute at the same rate. `pg_stat_statements` named the statements: the gateway's grouped
projection (the lock and the read of several pipelines and their stages, their merged UPDATE) read 115
blocks a call in the first minute and 1,560 in the tenth, its one-pipeline statements a flat 8-16.
`auto_explain` showed the plans: sequential scans. psycopg prepares a statement after five runs, and
PostgreSQL kept the generic plan it had made while the tables were nearly empty; nothing planned again,
since this host's PostgreSQL runs with autovacuum off (a `conf.d` file of its CI set-up), so no table is
ever analyzed (where autovacuum runs, an ANALYZE of the table makes every session plan again). In a
4,000-pipeline throughput run the relay's UPDATE that marks rows published had the same plan on the
growing outbox, 1,360 of its calls over 3 ms: whether a run met the steady target depended on the size of
each table when each connection's plan was made. Those statements, all that find rows by an array of ids,
are now planned at every run (`castad_runtime.db.REPLAN`), and the merged UPDATE gives its ids as an array
too (the planner guesses 100 rows from `jsonb_to_recordset` and had joined them by scanning the table):
the same 4,000 pipelines then logged no statement of Castad's over 3 ms with a sequential scan but one mark
planned while its outbox was small. Step 13's full run (ab2db7fa) met the steady target for the first time
since step 10: p99 109 ms in the first minute, 119 ms at worst. Its other ratios lie within those of the
four runs before (throughput 0.75×, CPU 1.76×, idle end to end 2.49× at the median of the rounds); the stage
handoff's p50 came to 5.0 ms (met; 5.3 before), the drain to 0.58×.

The parts also showed stage rows without a start: the gateway's consumer threads may project a stage's
`completed` before its `started`, and the late `started` was dropped whole, so the stage showed no start
and `/v1/stats` left it out of the stage durations it times. Such a start now fills a stage row of its
attempt that has none; the stage still never moves back.

Step 14 (2026-11-26, a later session, on a 2-core AMD EPYC far slower than the Xeon of step 13: a PostgreSQL
round trip took 0.51 ms back to back against 0.06 ms, DBOS did 29.2-32.1 workflows/s against 42.5-45.9, and
the hypervisor took 1-9% of the CPU in the steady run). Its full run (b2cb889b) has the code of step 13
with one more column in the paired rounds: when the video stage recorded its last success and when the
gateway recorded the last pipeline's end. Castad's ratios stayed where they were (throughput 0.71×, CPU
1.80×, idle end to end 2.53×); the handoff p50 (6.7 ms) and the steady run missed on this host, its slowest
minutes those where the hypervisor took 6-9% (p99 327-390 ms), its two fastest those where it took 1-2%
(118 and 144 ms). In every round the gateway finished 1.4-1.6 s after the last stage, 15-17% of the run,
the stages and the relay idle meanwhile: the stages had outrun the gateway's projection. Seen from inside,
the projection was one line of transactions: a grouped transaction was under way 90-95% of every second of
the throughput run, 4.5 events a group, 18 ms a group at the median and 55 ms at p90; in the run's last
second py-spy found the gateway holding the GIL in only 54% of its samples, so it waited on PostgreSQL
more than it computed. Tried and not kept, in alternating runs of two installations each: the gateway at
nice -10 (18.3-21.2 against 20.4-22.7 pipelines/s), 24 consumer threads instead of 8 (bigger groups: 24.6-27.9
against 23.1-27.1), the timeline's listener off (19.0 against 20.7 ms of the gateway's CPU, within the
spread), a 0.5 ms GIL switch interval again (one pair, no change beyond the spread).

Kept, after that run: two grouped transactions of the projection may be under way at once
(`castad_runtime.groups`, `max_groups`), never two with events of the same pipeline (an event whose
pipeline a transaction under way has waits for it, so a pipeline's events are still projected in the order
they were handed in). Two installations with it against two without, alternating, two throughput runs of
200 pipelines in each: the gateway finished 1.26-1.41 s after the last stage against 1.77-2.44 s, throughput
19.9-24.3 pipelines/s (mean 21.9) against 17.2-20.8 (mean 19.5), the gateway's part after the video stage's
success p50 1.3-1.9 s against 2.0-3.2 s, the gateway's CPU within the spread (21.3-24.6 against 21.9-23.9 ms a
pipeline). About a tenth more throughput on this host, which the next full run will put beside DBOS.

Step 15 (2026-11-27, a later session, the same kind of host). Its full run (ddd39993) was the first beside
DBOS with two grouped transactions of the projection under way. Its ratios lie with those of the runs before
(throughput 0.68×, rounds 0.53-0.71×; CPU 1.91×, 1.84-2.38×; idle end to end 2.62×, 2.33-2.85×); the host was
faster than in step 14's run, DBOS more so (34.4-44.0 workflows/s against 29.2-32.1, Castad 20.5-31.1 against
19.5-22.3 pipelines/s). The gateway finished 0.8-2.2 s after the last stage (1.4-1.6 s in step 14's run), so
the shorter tail the alternating runs had shown did not show beside DBOS; the gateway commits more often
(6.8 commits a pipeline in its database against 5.6: with two under way its groups are smaller). The
steady run met its target here (p99 266 ms in the first minute, below it in every other, no steal).

Tried and not kept: the projection in a process of its own (HTTP and the background loops in one, the
consumer and its projection in another). One installation, the two ways alternating, four throughput runs of
200 pipelines each: the gateway's part after the video stage's success came down (p50 0.5-1.4 s against
1.1-2.0 s), but the stages finished later (7.6-9.2 s after the first POST against 5.9-8.4 s) and throughput
fell (20.0-22.8 pipelines/s, mean 21.8, against 20.7-27.5, mean 23.3), with more CPU a pipeline (79.1-91.5
against 64.0-85.8 ms; the two gateway processes 22.8-26.3 ms against 18.9-23.2 for one). On two busy cores a
sixth process takes from the stages the time the projection stops losing to the GIL. A `make profile` of the
gateway on this host, by library (self time, no native frames): psycopg 27.5% (its pipeline's exchange with
the server 8.2%), Castad's own code 12.1%, pika 9.9%, threading 5.6% (the hand-over of each synchronous route
to a worker thread 2.0%, the groups' wake-ups 1.7%), Dramatiq 5.1%, FastAPI 4.3%, json 4.2% (the merged
writes' JSON 1.9%), pydantic 4.0%, SQLAlchemy 3.1%: no part that a change could take away without a guarantee
is above a few percent.

Step 16 (2026-11-27, a later session, a quieter host). A POST cost three commits and a rollback in the
gateway's database: a pre-ping `SELECT 1` (a transaction of its own in PostgreSQL's statistics) on each of
its two checkouts, and the key's read in a transaction that was rolled back. Now no pool pings: a checkout
polls the idle connection's socket (no round trip), which a server that ended the session (a restart, an
outage's `pg_terminate_backend`) has made readable with its reason, and the pool replaces it (a test ends the
session under a pooled connection and fails without the poll); a connection never handed out is not looked at,
as a pre-ping would not (SQLAlchemy tries a checkout twice, and a second refusal raised an error that is no
outage's: a second test ends the replacement too); the key is read in autocommit. Over 3 × 300
POSTs with no events flowing: 3.0 commits and 1.0 rollback a POST before, 2.0 and 0 after; PostgreSQL's CPU
0.77-0.87 ms a POST before, 0.43-0.60 after; the gateway's own within its spread (1.6-1.8 ms against 1.6-2.0).

Its full run (f93691a9) came after it, on a host twice as fast as step 15's (a PostgreSQL round trip after
10 ms idle 0.06 ms against 0.52; DBOS 65-97 workflows/s against 34-44). Commits a pipeline 15.7 (the
gateway's 5.7 against 6.8), fewer than DBOS's 16.2. The ratios stayed where they were: throughput 0.66×
(rounds 0.62-0.77×), CPU 1.90× (1.61-1.98×), idle end to end 2.76× (2.64-3.27×). Both idle handoff targets are
met here (p50 2.7 ms, p99 5.3), as they were not in step 15's run with the same stage machine and relay: the
host, not the code, moved them.

Where the rest goes, looked at on that host after that run:
- PostgreSQL's CPU by database (its server processes, a throughput run of 200 pipelines, twice): the gateway's
  3.4 ms a pipeline, each stage's 1.1-1.4, 7.1-7.3 in all. With `pg_stat_statements` loaded for one such run
  (then unloaded again): 73 statements a pipeline, whose execution and planning took 3.6 ms; the rest of
  PostgreSQL's CPU is the work around them (protocol, commits, triggers' NOTIFY, waking backends). One
  statement waited: the count of a key's creations waited 73 ms on average for the counter's row lock, held to
  each creation's commit (the count decides, so it is taken last): all 8 POSTs in flight use one key. It costs
  no CPU, and creations stayed ahead of the stages (200 accepted in 2.3 s, 85 a second).
- The relay at idle, timed inside it (an instrumented copy run in its place, not kept): woken → rows read
  0.01 ms, the read 0.32 ms, → publish 0.04 ms, the confirm 1.3 ms, the mark 0.45 ms (p50). A stage's
  `completed` committed while the relay awaits the confirm of the same pipeline's `started` waits for it: a
  pipeline's row goes out once the one before it is confirmed, an ordering guarantee kept.
- A stage at idle, timed inside the song stage the same way: the trigger's transaction (inbox row, job,
  claim, `started` event) 3.0 ms to its commit, the hand-over to the scheduler's pool 0.3 ms, the provider's
  thread started 0.2 ms, the instant provider's work 1.1 ms, the outcome's transaction 1.4 ms and its commit
  0.7 ms (p50). Each step is a round trip, a WAL flush, a thread waking or the work itself; DBOS runs the same
  work and three checkpoints in 11 ms a workflow in one process, with no broker hop between its steps.
Step 17 (2026-11-27, a later session, on a slower host: a PostgreSQL round trip after 10 ms idle 0.32 ms
against 0.06). A throughput run of 200 pipelines, sampled every 0.1 s: while the POSTs came in, the gateway's
queue grew to 215-541 events, and its last pipeline ended 0.7-0.9 s after the video stage's last success, the
gateway projecting alone. A projection group is made of the events the consumer's threads hold, one each: with
8 threads and two groups under way, a group had at most 7 events. (Step 14 had tried 24 threads with one group
under way, within the spread then.) Now the gateway has 32 consumer threads (`CASTAD_API_CONSUMER_THREADS`),
and the projection's own pool no longer grows with them: 4 connections (8 with overflow) serve its groups under
way and the events left to their own threads; a thread without one waits. One installation, alternating
throughput runs of 200 pipelines: 8 threads 31.1 and 32.5 pipelines/s (the queue up to 215 and 384 events),
32 threads 40.0 and 37.2 (the queue empty), 16 threads 37.3 (up to 78); the gateway's CPU 13.3-13.9 ms a
pipeline with 8, 11.0-11.9 with 32. 64 threads did worse in its one run (28.3 pipelines/s, every process's CPU
up with it, so the host's drift or the threads' own cost); not pursued.

Tried and not kept, with the gateway keeping up: more attempts at once in each stage. The lyric stage then had
up to 43 jobs waiting for its two slots, but the two cores were busy: `CASTAD_<STAGE>_CONCURRENCY` 4 gave 44.3
and 40.0 pipelines/s, 8 gave 37.3, against 44.7 and 42.5 with 2 (alternating), with more CPU a pipeline. The
per-key creation counter left out (an experiment only): the POSTs finished sooner, the stages as late as before
(42.2 and 48.6 pipelines/s), so its lock does not bound throughput.

Its full run (c23aacf7) came after it. The gateway now ends 0.006-0.014 s after the last stage, against
0.66-0.82 s in f93691a9's rounds; commits a pipeline 14.3 (the gateway's 4.6 against 5.7). The ratios moved
less than the tail: throughput 0.71× (rounds 0.63-0.89×, against 0.66×), CPU 1.87× (1.53-2.09×, against
1.90×); idle end to end 3.28× (2.36-3.36×): the slow round trip after idle costs Castad's hops more than
DBOS's checkpoints. The steady run missed its target here (worst minute p99 211 ms against 50 in the first).
Run again alone on the same host at the same rate, 10 minutes each (one run each, not alternated): with 8 threads
p99 65-182 ms and p50 34-58, the first minute at 133; with 32 threads p50 68-114 ms in the first four minutes and
29-32 ms in the other six (p99 271 ms in the first minute, 49-79 ms in the last six). Both swing with the host,
but 32 threads were the slower in those first minutes: a cost of the threads to the steady tail is not ruled
out by these runs.

Step 18 (2026-11-27, a later session, a faster host: in its throughput runs Castad did 44-66 pipelines/s, DBOS
67-87 workflows/s). No change to a pipeline's path; what is left was looked at once more, and three
settings were tried on one installation, alternating, two throughput runs of 300 pipelines each way:
- Python's event loop: uvloop in the relay (the gateway's uvicorn already runs on it). The relay's CPU 2.83 and
  3.13 ms a pipeline against 3.10 and 3.07, the whole installation 28.7 and 33.3 ms against 31.2 and 31.6: the
  spread of the runs, not kept.
- The collector's first generation at 50,000 allocations instead of 700: 30.5 and 30.1 ms against 31.3 and
  30.8, within the spread, and rightly so: a `gc.callbacks` probe over 600 pipelines found the stages and the
  relay collecting in 0.0-0.3% of their CPU and the gateway in 2.7% (a full collection takes at most 4 ms, as
  each service freezes its start-up heap, `castad_runtime.process`). Not kept.
- RabbitMQ's classic queues in their version 2 format (the `queue-version` policy on this run's queues): the
  broker used more CPU with it (3.10 and 2.97 ms a pipeline against 2.57 and 2.60). Not kept.

What a pipeline writes, over 300 pipelines of a throughput run: 47 KB of WAL against DBOS's 6.8 KB a workflow.
Each stage's job row (0.8-1.5 KB, the trigger's input in it) is written three times (made, claimed,
finished), each event's outbox row (0.9-1.1 KB) twice (made, marked published), and the gateway's timeline
keeps every event; DBOS writes its input, three step outputs and a status
row. Statements, from PostgreSQL's log over 20 pipelines: 12.6-15.7 a pipeline in each stage's database,
BEGIN, COMMIT and the relay's reads and marks included (2.2-2.6 commits), 37.6 in the gateway's. A stage at
idle, timed inside it (a probe loaded in every stage, not kept; 149 attempts, p50): its trigger's commit →
a thread of the scheduler's pool 0.37 ms → the attempt's start 0.21 → the provider's thread running 0.26 → the
instant work done 1.06 → the outcome's transaction begun 0.13 → committed 2.58. Each of these is a thread
waking, a round trip or a WAL flush; none is an extra step that a guarantee does not ask for.

This page's run (25e68444) came after it, on the same host. Throughput 0.79× (rounds 0.74-0.85×) and CPU 1.72×
(1.60-1.78×) are the nearest to their targets of the ten paired full runs, and neither is met; idle end to end
2.76× (2.53-2.81×), not met; the handoff (p50 4.2 ms, p99 7.6) and the drain (0.65×) met. The steady run missed:
p99 439-503 ms in minutes 3 to 5, while the machine's load average rose to 5.2-5.7 and it was 83-89% busy,
against 84 ms in the first minute and 56-86 ms in minutes 6 and 8 to 10. At half this run's peak (31.7
pipelines/s) the installation used 1.4 of the 2 cores: a pipeline costs more at a steady rate than in a burst
(45 ms of CPU in the first minute against 29.7; the gateway's 11.6-14.7 ms against 6.9, as its groups are small
and each event wakes it), so half the peak rate is not half the machine."""


def _paired_rounds(add: Any, r: dict[str, Any], ratios: dict[str, list[float]], medians: dict[str, float]) -> None:
    rounds, lot = r["paired"]["rounds"], r["paired"]["idle_lot"]
    counting = {name: r[name]["commits_run"] for name in ("castad", "dbos")}
    add("### Paired rounds")
    add("")
    add(
        "This host's speed drifts within minutes (see step 10 below), so Castad and DBOS run side by side: "
        "both installations up at once (the other one idle meanwhile), each round a throughput run of each "
        f"({r['castad']['throughput']['pipelines']} pipelines, as above) and then {lot} pipelines of each one at "
        "a time (end to end from the databases, as in A and D), who goes first alternating from round to round "
        "(`bench/paired.py`). Commits are counted in a throughput run of each before the rounds, which also "
        f"warms each up under load ({_f(counting['castad']['rate'])} and {_f(counting['dbos']['rate'])} "
        "pipelines/s)."
    )
    add("")
    add(
        "| round | first | pipelines/s Castad / DBOS | ratio | CPU ms Castad / DBOS | ratio "
        "| idle end to end p50 ms Castad / DBOS | ratio | Castad: stages done / gateway done (s) |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for number, (one, tput, cpu, idle) in enumerate(
        zip(rounds, ratios["throughput"], ratios["cpu"], ratios["idle_e2e_p50"], strict=True), start=1
    ):
        c, d = one["castad"], one["dbos"]
        add(
            f"| {number} | {one['order'][0]} | {_f(c['throughput']['rate'])} / {_f(d['throughput']['rate'])} "
            f"| {tput:.2f}× | {_f(paired.cpu_ms(c['throughput']))} / {_f(paired.cpu_ms(d['throughput']))} "
            f"| {cpu:.2f}× | {_f(c['idle_e2e_ms']['p50'])} / {_f(d['idle_e2e_ms']['p50'])} | {idle:.2f}× "
            f"| {_f(c['throughput']['stages_seconds'], 2)} / {_f(c['throughput']['seconds'], 2)} |"
        )
    add(f"| median | | | {medians['throughput']:.2f}× | | {medians['cpu']:.2f}× | | {medians['idle_e2e_p50']:.2f}× | |")
    add("")
    add(
        "*Stages done*: from the first POST to the video stage's last success; *gateway done*: to the last "
        "pipeline's end in the gateway's database, the end of the throughput run (see A)."
    )
    add("")


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}×"


def _f(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _steady_cpu_and_tail(add: Callable[[str], None], steady: dict[str, Any]) -> None:
    """The steady run's CPU per process per minute, and where each minute's slowest pipelines spent their
    time (runs before these were recorded have neither)."""
    servers, tails = steady.get("servers", {}), steady.get("tail_parts")
    if not tails:
        return
    names = list(next(iter(servers.values()))["cpu_s"]) if servers else []
    add(
        "CPU seconds each process of the installation used in each minute (the client is the harness's "
        "process), beside where that minute's slowest pipelines (those at or above its p99) spent their time, "
        "as the mean in ms of each part: `to <stage>` from the moment before (the pipeline's creation or the "
        "previous stage's finish) to the stage's start, then the stage itself, then `to finished` from the "
        "last stage's finish to the gateway's `finished_at` (stages' times by their own clocks, on this one "
        "machine)."
    )
    add("")
    parts = list(next(iter(tails.values())))
    add("| minute | " + " | ".join(f"{name} CPU (s)" for name in names) + " | " + " | ".join(parts) + " |")
    add("|---" * (1 + len(names) + len(parts)) + "|")
    for minute, tail in tails.items():
        seen = servers.get(str(minute), servers.get(minute)) or {"cpu_s": {}}
        cpu = [_f(seen["cpu_s"].get(name), 1) for name in names]
        add(f"| {int(minute) + 1} | " + " | ".join(cpu + [_f(tail[part], 0) for part in parts]) + " |")
    add("")


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}×"


def _in_order(read_back: dict[str, Any], rows: int) -> bool:
    """Whether a drain's queue gave back every row once, each pipeline's in order."""
    return read_back["out_of_order"] == 0 and read_back["duplicates"] == 0 and read_back["received"] == rows


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _load(values: Any) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def render(r: dict[str, Any]) -> str:
    facts, castad, peers, notify = r["facts"], r["castad"], r["peer"], r["notify"]
    idle, tput = castad["idle"], castad["throughput"]
    handoff = idle["handoff_stages"]["total"]
    peer, confirms = peers["defaults"], peers["confirms"]
    peer_handoff = peer["idle"]["handoff"]
    n = tput["pipelines"]
    pg = facts["postgres"]
    lines: list[str] = []
    add = lines.append

    add("# Benchmarks")
    add("")
    add(
        "Generated by `make bench` (`.venv/bin/python -m bench.run`, the harness in `bench/`); "
        "do not edit by hand, run it again. Every figure below comes from the one run described here."
    )
    add("")
    add("## Machine and servers")
    add("")
    add("| | |")
    add("|---|---|")
    add(f"| date | {facts['date']} (run `{r['run_id']}`, {r['seconds']:.0f} s in all) |")
    add(f"| CPU | {facts['cores']} cores, {facts['cpu']}; {facts['memory']} memory; {facts['kernel']} |")
    add(f"| Python | {facts['python']} ({', '.join(f'{k} {v}' for k, v in facts['packages'].items())}) |")
    add(
        f"| PostgreSQL | {pg['version']} on 127.0.0.1 (synchronous_commit={pg['synchronous_commit']}, "
        f"fsync={pg['fsync']}, wal_sync_method={pg['wal_sync_method']}, shared_buffers={pg['shared_buffers']}"
        + "".join(f", {name}={pg[name]}" for name in ("checkpoint_timeout", "autovacuum") if name in pg)
        + ") |"
    )
    add(f"| RabbitMQ | {facts['rabbitmq']} on 127.0.0.1 |")
    rtt = facts["postgres_round_trip_ms"]
    add(
        f"| PostgreSQL round trip (`SELECT 1`, median) | {_f(rtt['hot'], 2)} ms back to back, "
        f"{_f(rtt['after_pause'], 2)} ms after 10 ms idle |"
    )
    loads = "; ".join(f"{name}: {_load(values)}" for name, values in r["load"].items())
    add(f"| load average (1/5/15 min) | {loads} |")
    add("")
    add(
        "The machine is shared: other work (test suites starting their own Castad stacks and "
        "databases) may run at the same time, and everything here (five Castad processes, the "
        "Dramatiq workers, PostgreSQL, RabbitMQ and the client) shares the same cores. The load "
        "averages above say how busy it was; figures from a busy machine are slower and noisier."
    )
    add("")

    dbos, drained, steady = r["dbos"], r["drain"], r["sustained"]
    dtput = dbos["throughput"]
    cpu_castad = paired.cpu_ms(tput)
    cpu_dbos = paired.cpu_ms(dtput)
    cpu_peer = sum(peer["throughput"]["cpu_ms_per_pipeline"].values())
    commits_castad = sum(tput["commits_per_pipeline"].values())
    e2e, de2e = idle["e2e_projection_ms"], dbos["idle"]["e2e_database_ms"]
    pe2e = peer["idle"]["e2e_ms"]
    add("## Summary")
    add("")
    add(
        "| | Castad (instant providers) | DBOS, three steps in a workflow | Castad / DBOS | plain Dramatiq, no "
        "durability | Castad / Dramatiq |"
    )
    add("|---|---|---|---|---|---|")
    add(
        f"| throughput, {n} pipelines (pipelines/s) | {_f(tput['rate'])} | {_f(dtput['rate'])} "
        f"| {_ratio(tput['rate'], dtput['rate'])} | {_f(peer['throughput']['rate'])} "
        f"| {_ratio(tput['rate'], peer['throughput']['rate'])} |"
    )
    add(
        f"| CPU per pipeline, every process and PostgreSQL (ms) | {_f(cpu_castad)} | {_f(cpu_dbos)} "
        f"| {_ratio(cpu_castad, cpu_dbos)} | {_f(cpu_peer)} | {_ratio(cpu_castad, cpu_peer)} |"
    )
    add(
        f"| commits per pipeline (PostgreSQL) | {_f(commits_castad)} | {_f(dtput['commits_per_pipeline'])} "
        f"| {_ratio(commits_castad, dtput['commits_per_pipeline'])} | 0 | |"
    )
    for q in ("p50", "p99"):
        add(
            f"| idle end to end {q} (ms) | {_f(e2e[q])} | {_f(de2e[q])} | {_ratio(e2e[q], de2e[q])} "
            f"| {_f(pe2e[q])} | {_ratio(e2e[q], pe2e[q])} |"
        )
    for q in ("p50", "p99"):
        add(
            f"| idle stage handoff {q} (ms) | {_f(handoff[q])} | (in one process) | | {_f(peer_handoff[q])} "
            f"| {_ratio(handoff[q], peer_handoff[q])} |"
        )
    add("")
    rounds = r["paired"]["rounds"]
    ratios = paired.ratios(rounds)
    medians = {name: statistics.median(values) for name, values in ratios.items()}

    def spread(name: str) -> str:
        return f"median of {len(rounds)} paired rounds {medians[name]:.2f}× (rounds {_range(ratios[name])})"

    add(
        f"Throughput and CPU above are those of the paired round whose throughput ratio is the median (see "
        f"*Paired rounds* below); idle end to end is from the detailed idle runs in A and D. The targets that are "
        f"ratios to DBOS stand on the median over the {len(rounds)} paired rounds of the ratio within each."
    )
    add("")
    add("### Targets")
    add("")
    add("| target | measured | |")
    add("|---|---|---|")
    add(
        f"| throughput ≥ 1.0× DBOS's | {spread('throughput')}; in the median round {_f(tput['rate'])} vs "
        f"{_f(dtput['rate'])} pipelines/s | {_met(medians['throughput'] >= 1.0)} |"
    )
    add(
        f"| CPU per pipeline ≤ 1.5× DBOS's | {spread('cpu')}; in the median round {_f(cpu_castad)} vs "
        f"{_f(cpu_dbos)} ms | {_met(medians['cpu'] <= 1.5)} |"
    )
    add(
        f"| stage handoff p50 ≤ {HANDOFF_P50_MS:g} ms at idle | {_f(handoff['p50'])} ms "
        f"| {_met(handoff['p50'] <= HANDOFF_P50_MS)} |"
    )
    add(
        f"| stage handoff p99 ≤ {HANDOFF_P99_MS:g} ms at idle | {_f(handoff['p99'])} ms "
        f"| {_met(handoff['p99'] <= HANDOFF_P99_MS)} |"
    )
    add(
        f"| idle end to end p50 ≤ 2× DBOS's | {spread('idle_e2e_p50')}; detailed runs {_f(e2e['p50'])} vs "
        f"{_f(de2e['p50'])} ms ({_ratio(e2e['p50'], de2e['p50'])}) | {_met(medians['idle_e2e_p50'] <= 2.0)} |"
    )
    per_service = ", ".join(f"{svc} {_f(v)}" for svc, v in tput["commits_per_pipeline"].items())
    add(
        f"| commits per pipeline, reported (aim: one per state-changing step, 3 per stage and 7 in the "
        f"gateway) | {_f(commits_castad)} ({per_service}) | reported |"
    )
    relay_rate, raw_rate = drained["relay"]["rate"], drained["raw"]["rate"]
    drain_ratios = [measured["ratio"] for measured in drained["rounds"]]
    ordered = all(_in_order(measured["order"], measured["relay"]["rows"]) for measured in drained["rounds"])
    add(
        f"| a {drained['relay']['rows']:,}-row outbox backlog drained at ≥ 0.5× a raw publish with confirms, in "
        f"order | median of {len(drain_ratios)} rounds {_f(statistics.median(drain_ratios), 2)}× (rounds "
        f"{_range(drain_ratios)}); in the median round {_f(relay_rate, 0)} vs "
        f"{_f(raw_rate, 0)} rows/s; {'in order, once each' if ordered else 'ORDER OR COUNT BROKEN'} "
        f"| {_met(statistics.median(drain_ratios) >= 0.5 and ordered)} |"
    )
    add(
        f"| p99 flat (≤ 1.5× the first minute's) over {len(steady['minutes'])} minutes at half the maximum "
        f"rate | worst minute {_f(steady['worst_minute_p99_ms'], 0)} ms vs first "
        f"{_f(steady['first_minute_p99_ms'], 0)} ms | {_met(steady['flat'])} |"
    )
    add("")
    _paired_rounds(add, r, ratios, medians)

    add("## A. Castad end to end, instant providers")
    add("")
    env = castad["env"]
    add(
        "Five processes (api, relay, lyric, song, video) started from `infra/local/Procfile` by "
        "`castad_local.stack.Stack`, each with its own database (`castad_bench_<run>_<service>`, made and "
        "migrated by `castad_local.stack.prepare`), namespace `" + env["CASTAD_NAMESPACE"] + "` on RabbitMQ, "
        "`CASTAD_<STAGE>_PROVIDER=instant` (each stage writes a tiny but valid artifact through its "
        "ArtifactStore: one lyric line, a 0.25 s silent WAV, an 18×32 one-frame H.264 MP4) and every "
        "other setting at its documented default (`OTEL_TRACES_EXPORTER=none`) but the per-key creation "
        "limit (`CASTAD_API_CREATIONS_PER_MINUTE=1000000`: still counted on every POST, never reached)."
    )
    add("")
    add(
        f"- **Throughput**: {n} briefs POSTed through the gateway, at most {tput['concurrency']} requests in "
        f"flight (all accepted after {_f(tput['submit_seconds'], 2)} s), until the gateway's database shows every "
        "one SUCCEEDED. Rate = pipelines / (last `pipelines.finished_at` − first POST). Latency of a pipeline "
        f"under that load: p50 {_f(tput['latency_ms']['p50'], 0)} ms, p99 {_f(tput['latency_ms']['p99'], 0)} ms. "
        f"The video stage recorded its last success {_f(tput['stages_seconds'], 2)} s after the first POST, "
        f"the gateway the last pipeline's end {_f(tput['seconds'] - tput['stages_seconds'], 2)} s after that; "
        "from the video stage's success (`jobs.finished_at`) to the gateway's `finished_at` of the same "
        "pipeline, that is the relay's hop and the gateway's projection with the events queued before it, "
        f"took p50 {_f(tput['gateway_lag_ms']['p50'], 0)} ms, p99 {_f(tput['gateway_lag_ms']['p99'], 0)} ms."
    )
    add(
        f"- **Idle**: after {r['args']['warmup']} warm-up pipelines, {idle['pipelines']} pipelines one at a time "
        "(submit, follow the SSE stream to the terminal event, 20 ms pause). End to end = "
        "`pipelines.finished_at − pipelines.created_at` in the gateway's database (the projection transaction "
        "that records SUCCEEDED minus the transaction that accepted the POST). Seen by the client "
        f"(POST sent → SSE terminal event read): p50 {_f(idle['e2e_client_ms']['p50'])} ms, "
        f"p99 {_f(idle['e2e_client_ms']['p99'])} ms."
    )
    add(
        "- **Handoff** = handler start in the consuming service − COMMIT of the outbox row in the producing "
        "service. COMMIT time: a deferred constraint trigger the harness adds to each outbox (its own "
        "databases, idle run only) stores `clock_timestamp()` when the writing transaction commits, before "
        "the commit's WAL flush. Handler start: `inbox.received_at`, `now()` of the handler's transaction, "
        "whose first statement is the inbox insert. *Stage handoff* = the three hops that start a stage: "
        "pipeline.requested (api → lyric), lyric.completed (lyric → song), song.completed (song → video)."
    )
    add(
        "- **Parts** of a handoff, timed over "
        f"{idle['observed']['pipelines']} more pipelines run the same way with the harness's observers on: "
        "*commit → NOTIFY seen* (the NOTIFY the outbox's trigger queues, delivered by "
        "the writer's COMMIT, seen by a LISTEN "
        "connection of the harness next to the relay's), *NOTIFY → broker* (the relay wakes, reads the rows, "
        "publishes; seen on a tap queue of the harness bound to the exchange with `#`), *broker → handler* "
        "(Dramatiq consumer, worker thread, envelope parsing, pool checkout and BEGIN). The harness's "
        "observers run in one Python process, so a late observer moves time between neighbouring parts "
        "(a part can even be negative). The observers also slow what they time (RabbitMQ routes every event to "
        "the tap queue too, PostgreSQL wakes one more listener on every commit, and the observing threads take "
        "their share of the two cores), so the totals and every other column come from the pipelines run "
        "without them, and *observed total* shows what the same hops took with them. *Confirmed* = "
        "`outbox.published_at` − COMMIT, not on the handler's path: the relay marks a row once RabbitMQ "
        "confirmed its batch. *From transaction start* = handler start − "
        "`outbox.created_at` (`now()`, the start of the writing transaction), an upper bound that adds the "
        "writer's own transaction."
    )
    add("")
    add(
        "| hop (ms) | n | total p50 | total p99 | observed total p50 | commit → NOTIFY p50 | NOTIFY → broker p50 "
        "| broker → handler p50 | confirmed p50 | from transaction start p50 |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|")
    observed = idle["observed"]
    rows = [("**stage handoff (3 hops)**", idle["handoff_stages"], observed["handoff_stages"])]
    rows += [(kind, parts, observed["handoff_per_hop"][kind]) for kind, parts in idle["handoff_per_hop"].items()]
    rows += [("stage events → api projection", idle["handoff_to_projection"], observed["handoff_to_projection"])]
    for name, parts, seen in rows:
        t = parts["total"]
        add(
            f"| {name} | {t['n']} | {_f(t['p50'])} | {_f(t['p99'])} | {_f(seen['total']['p50'])} "
            f"| {_f(seen['commit_to_notify']['p50'])} | {_f(seen['notify_to_broker']['p50'])} "
            f"| {_f(seen['broker_to_handler']['p50'])} | {_f(parts['confirmed']['p50'])} "
            f"| {_f(parts['from_tx_start']['p50'])} |"
        )
    add("")
    add(
        "Inside a stage at idle (instant provider), from the handler's transaction (`jobs.created_at`): the "
        "attempt claimed, the handler's transaction committed with the `started` event, the transaction that "
        "records the outcome begun (`attempts.finished_at`: between the two, the hand-over to a thread of the "
        "scheduler's pool and the provider's own thread), the `completed` event committed. p50 / p99 (ms):"
    )
    add("")
    add("| stage | → attempt claimed | → `started` committed | → outcome's recording begun | → `completed` committed |")
    add("|---|---|---|---|---|")
    steps = (
        "handler_to_claim_ms",
        "handler_to_started_commit_ms",
        "handler_to_recording_ms",
        "handler_to_completed_commit_ms",
    )
    for stage, parts in idle["inside_stage"].items():
        cells = [parts.get(step) for step in steps]  # runs before step 9 recorded the first and last only
        add(f"| {stage} | " + " | ".join(f"{_f(c['p50'])} / {_f(c['p99'])}" if c else "" for c in cells) + " |")
    add("")
    add(f"CPU time per pipeline during the throughput run ({n} pipelines), by process (ms):")
    add("")
    cpu = tput["cpu_ms_per_pipeline"]
    add("| " + " | ".join(cpu) + " | all |")
    add("|" + "---|" * (len(cpu) + 1))
    add("| " + " | ".join(_f(v) for v in cpu.values()) + f" | {_f(sum(cpu.values()))} |")
    add("")
    add(
        "`postgres` = the server processes of this run's connections; `rabbitmq` = the whole broker "
        "(shared with anything else using it); `client` = the harness."
    )
    add("")

    add("## B. The peer: a plain Dramatiq pipeline")
    add("")
    add(
        f"Three no-op actors chained (`bench/peer_actors.py`: step1 sends step2, step2 sends step3) on the "
        f"same RabbitMQ with queues of their own, run by Dramatiq's command line "
        f"(`python -m dramatiq bench.peer_actors --processes {peer['processes']} --threads {peer['threads']}`, "
        "its defaults spelled out). `RabbitmqBroker` with its defaults (persistent messages on durable "
        "queues, no publisher confirms); the *publisher confirms* column sets `confirm_delivery=True` as "
        "Castad's relay does. The client enqueues step1 messages from this process."
    )
    add("")
    add(
        f"- **Throughput**: {n} pipelines enqueued at once (in {_f(peer['throughput']['submit_seconds'], 2)} s), "
        "rate = pipelines / (last step3 start − first enqueue). With no-op actors the client's enqueueing "
        "is a large part of that time, and the run is short."
    )
    sustained = peer.get("sustained")
    if sustained:
        add(
            f"- **Longer run** (defaults): {sustained['pipelines']} pipelines the same way, "
            f"{_f(sustained['rate'])} pipelines/s (enqueued in {_f(sustained['submit_seconds'], 2)} s, "
            f"{_f(sustained['seconds'], 2)} s in all; latency p50 {_f(sustained['latency_ms']['p50'])} ms, "
            f"p99 {_f(sustained['latency_ms']['p99'])} ms)."
        )
    add(
        "- **Handoff** = next actor's first line − just before `.send()` of the previous one (`time.time()`); "
        "**end to end** = step3 starts − the client's enqueue. Castad's end to end has one hop more (the "
        "gateway's projection of video.completed) and an HTTP request."
    )
    add("")
    add("| (ms) | defaults p50 | defaults p99 | confirms p50 | confirms p99 |")
    add("|---|---|---|---|---|")
    for name in peer["idle"]["handoff_per_hop"]:
        a, b = peer["idle"]["handoff_per_hop"][name], confirms["idle"]["handoff_per_hop"][name]
        add(f"| handoff {name} | {_f(a['p50'])} | {_f(a['p99'])} | {_f(b['p50'])} | {_f(b['p99'])} |")
    a, b = peer["idle"]["e2e_ms"], confirms["idle"]["e2e_ms"]
    add(f"| end to end at idle | {_f(a['p50'])} | {_f(a['p99'])} | {_f(b['p50'])} | {_f(b['p99'])} |")
    a, b = peer["throughput"]["latency_ms"], confirms["throughput"]["latency_ms"]
    add(f"| end to end under the throughput run | {_f(a['p50'])} | {_f(a['p99'])} | {_f(b['p50'])} | {_f(b['p99'])} |")
    add("")
    for name, data in (("defaults", peer), ("confirms", confirms)):
        cpu = data["throughput"]["cpu_ms_per_pipeline"]
        add(f"CPU per pipeline ({name}): " + ", ".join(f"{k} {_f(v, 2)} ms" for k, v in cpu.items()) + ".")
        add("")

    add("## D. The durable peer: DBOS")
    add("")
    add(
        "The same three steps as one DBOS workflow (`bench/dbos_app.py`): three `@DBOS.step()` functions that "
        "run Castad's own instant providers and artifact store (the same files, hashed and renamed the same "
        "way), behind a FastAPI front like Castad's gateway: a POST validates the brief with Castad's request "
        "model and starts the workflow under its `Idempotency-Key` as workflow id (DBOS runs a workflow id "
        "once). One process, workflows started directly (no queue), DBOS's defaults otherwise (LISTEN/NOTIFY "
        "on), its system database a PostgreSQL database of this run on the same server. DBOS checkpoints the "
        "workflow's input, each step's output and the workflow's end in PostgreSQL, in one process: it has no "
        "broker, no separate services, no per-stage retries or leases of its own beyond recovery at restart."
    )
    add("")
    add(
        f"- **Throughput**: {dtput['pipelines']} briefs POSTed, at most {dtput['concurrency']} in flight, until "
        f"`dbos.workflow_status` shows every one SUCCESS: {_f(dtput['rate'])} workflows/s (latency p50 "
        f"{_f(dtput['latency_ms']['p50'], 0)} ms, p99 {_f(dtput['latency_ms']['p99'], 0)} ms)."
    )
    dcpu = dtput["cpu_ms_per_pipeline"]
    add(
        "- **CPU per workflow**: "
        + ", ".join(f"{k} {_f(v)} ms" for k, v in dcpu.items())
        + f" ({_f(cpu_dbos)} in all)."
    )
    add(f"- **Commits per workflow** (`pg_stat_database`): {_f(dtput['commits_per_pipeline'])}.")
    add(
        f"- **Idle**: {dbos['idle']['pipelines']} workflows one at a time; end to end = `updated_at − created_at` "
        f"of its `workflow_status` row: p50 {_f(de2e['p50'])} ms, p99 {_f(de2e['p99'])} ms (the client waits "
        "with DBOS's `get_result`, which polls once a second, so the client's own figure says nothing)."
    )
    add("")
    add("## E. Draining an outbox backlog")
    add("")
    add(
        f"An outbox of its own filled with {drained['relay']['rows']:,} real envelopes ({drained['per_pipeline']} per "
        f"pipeline, written with COPY in {_f(drained['fill_seconds'], 1)} s) while no relay ran, then the relay "
        "started on it with its defaults; a queue bound to `#` collects every message and is read back to check "
        "that each pipeline's events arrived in order, once each. The raw peer publishes the same bodies with the "
        f"same properties to the same exchange with aiormq, {drained['raw']['window']} unconfirmed publishes at a "
        "time on one channel in confirm mode, no database. The harness sees the end by one look every 50 ms in "
        "the relay's own partial index (whether a row is left to publish). Every drain figure before run df2cfb9e "
        "(all those in the sections below) was measured while the harness counted the unpublished rows "
        "instead, with a filter that index does not cover: a read of the whole outbox 20 times a second, on "
        "the same two cores as the relay, and counted in the drain's PostgreSQL CPU."
    )
    add("")
    rel = drained["relay"]
    add(
        f"Relay and raw publisher run in {len(drained['rounds'])} rounds, who goes first alternating, the outbox "
        "emptied and filled again between them (this host's speed drifts within minutes, see *Paired rounds*); "
        "the target stands on the median of the ratios within rounds, and the table below is the median round."
    )
    add("")
    add("| round | first | relay rows/s | raw rows/s | ratio | read back |")
    add("|---|---|---|---|---|---|")
    for number, measured in enumerate(drained["rounds"], 1):
        read = "in order, once each" if _in_order(measured["order"], measured["relay"]["rows"]) else "BROKEN"
        add(
            f"| {number} | {measured['first']} | {_f(measured['relay']['rate'], 0)} | {_f(measured['raw']['rate'], 0)} "
            f"| {_f(measured['ratio'], 2)}× | {read} |"
        )
    add("")
    add("| median round | rows/s | seconds | note |")
    add("|---|---|---|---|")
    add(
        f"| relay, from its start to the last row marked published | {_f(rel['rate'], 0)} "
        f"| {_f(rel['seconds_from_start'], 1)} | publishing alone took {_f(rel['seconds_publishing'], 1)} s |"
    )
    add(f"| raw aiormq, publisher confirms | {_f(raw_rate, 0)} | {_f(drained['raw']['seconds'], 1)} | |")
    add("")
    order = drained["order"]
    add(
        f"Read back: {order['received']:,} messages, {order['out_of_order']} out of order, {order['duplicates']} "
        "twice. CPU per 1,000 rows: "
        + ", ".join(f"{k} {_f(v, 0)} ms" for k, v in rel["cpu_ms_per_1000_rows"].items())
        + "."
    )
    add("")
    add("## F. A long run at a steady rate")
    add("")
    add(
        f"Castad as in A, briefs POSTed open loop at {_f(steady['rate'])} pipelines/s (half of A's throughput) "
        f"for {len(steady['minutes'])} minutes ({steady['pipelines']:,} pipelines, {steady['submitted_late']} "
        "sent more than a second late); latency = `finished_at − created_at` in the gateway's database, by the "
        "minute the pipeline was created."
    )
    add("")
    add(
        "What the servers did in each minute, beside it (sampled every 5 s): PostgreSQL checkpoints finished "
        "(a timed one spreads its writes over most of `checkpoint_timeout`, then fsyncs), full-page images "
        "written to the WAL (the first change of each page after a checkpoint starts logs the whole page), WAL "
        "written, autovacuum and autoanalyze runs on the installation's tables, the highest one-minute load "
        "average of the machine, and the share of the machine's CPU time that was busy, waiting for I/O, or "
        "stolen by the hypervisor (from /proc/stat)."
    )
    add("")
    add(
        "| minute | pipelines | p50 (ms) | p99 (ms) | checkpoints finished | full-page images | WAL (MB) "
        "| autovacuum runs | load | busy | iowait | steal |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|---|---|")
    servers = steady.get("servers", {})
    for minute, summary in steady["minutes"].items():
        seen = servers.get(str(minute), servers.get(minute))
        beside = (
            f"{seen['checkpoints']:.0f} | {seen['full_page_images']:,.0f} | {_f(seen['wal_mb'], 1)} "
            f"| {seen['autovacuums']:.0f} | {_f(seen['load'], 2)} | "
            + " | ".join(_percent(seen.get(state)) for state in ("busy", "iowait", "steal"))
            if seen
            else " | | | | | | | "
        )
        add(f"| {int(minute) + 1} | {summary['n']} | {_f(summary['p50'], 0)} | {_f(summary['p99'], 0)} | {beside} |")
    add("")
    _steady_cpu_and_tail(add, steady)

    add("## Where an idle handoff's time goes")
    add("")
    parts = idle["observed"]["handoff_stages"]
    rtt = facts["postgres_round_trip_ms"]
    add(
        f"A stage handoff took {_f(handoff['p50'])} ms at the median ({_f(parts['total']['p50'])} ms with the "
        f"harness's observers on): {_f(parts['commit_to_notify']['p50'])} ms "
        f"from the COMMIT to the NOTIFY reaching a listener, {_f(parts['notify_to_broker']['p50'])} ms until the "
        f"relay's message came out of the broker on the tap queue and {_f(parts['broker_to_handler']['p50'])} ms "
        "from there to the next handler's transaction. On that path, in order: the writer's COMMIT (a WAL "
        "flush, which delivers the NOTIFY the outbox's trigger queued), the relay woken by the notification, "
        "its SELECT of the new rows, its publish, RabbitMQ routing and delivering to the consumer's Dramatiq "
        "consumer thread, the hand-over to a worker thread, the envelope and payload validation, the BEGIN and "
        "the inbox insert: four PostgreSQL round trips and a broker hop, passing through the writer, the relay "
        "and the consumer, each of them "
        "(and each server process) woken from sleep at idle. On this machine a PostgreSQL round trip "
        f"after 10 ms of idleness takes {_f(rtt['after_pause'], 2)} ms against {_f(rtt['hot'], 2)} ms back to "
        f"back. For comparison, the whole hop of the plain Dramatiq pipeline (send → next actor, one process to "
        f"another through the same RabbitMQ) took {_f(peer_handoff['p50'])} ms at the median. Dramatiq's worker "
        "settings are not on this path: its consumer threads block on the socket (no polling interval) and "
        "prefetch only matters when messages queue up."
    )
    add("")
    chain = sum(idle["handoff_per_hop"][kind]["total"]["p50"] for kind in idle["handoff_per_hop"])
    inside = sum(v["handler_to_completed_commit_ms"]["p50"] for v in idle["inside_stage"].values())
    add(
        f"An idle pipeline took {_f(e2e['p50'])} ms at the median. Its four handoffs (three stages and the "
        f"gateway's projection of video.completed) add up to {_f(chain)} ms of medians; the three stages, from "
        f"the handler's transaction to the committed `completed` event, to {_f(inside)} ms: with an instant "
        "provider that is the stage machine's own work (the job claimed in the trigger's own transaction with "
        "its `started` event, a provider thread per attempt under the process's one heartbeat, the artifact's "
        "sha256 and rename, "
        "the completing transaction)."
    )
    add("")
    used = cpu_castad * tput["rate"] / 1000
    cores = facts["cores"] or 1
    bound = (
        "so CPU, not waiting, bounds Castad's throughput here"
        if used >= 0.7 * cores
        else "so waiting, not only CPU, bounds Castad's throughput here"
    )
    add(
        "Castad spends far more CPU per pipeline than the no-op peer (see the CPU rows): every stage records "
        "its inbox entry, job, attempt and two outbox events in its own database, the relay reads, publishes and "
        "marks seven events, and the gateway projects six of them (its timeline, attempts and read model), "
        f"{_f(commits_castad, 0)} commits per pipeline for the durable, once-only, observable behaviour that the "
        "plain pipeline does not have, in five processes that hand each other every step through a broker. During the "
        f"throughput run this run's processes used {used:.1f} of the {cores} cores ({_f(cpu_castad)} ms × "
        f"{_f(tput['rate'])} pipelines/s), {bound}."
    )
    add("")
    add(HOT_PATH_CHANGES)
    add("")
    add(CHANGES)
    add("")
    add("## C. NOTIFY inside the transaction or after the commit")
    add("")
    py = notify["python"]
    add(
        f"{py['threads']} threads on a scratch database, each running {py['per_thread']} transactions per round "
        f"({py['rounds']} rounds, variants interleaved, table truncated and CHECKPOINT before each), every "
        "transaction inserting one outbox row, while one connection LISTENs on the outbox channel. "
        "*none*: no NOTIFY; *after_commit*: after the commit, the NOTIFY as an autocommit statement on the same "
        "connection (Castad's way until its outbox had a trigger); *in_transaction*: a trigger on the outbox "
        "NOTIFYs before COMMIT (Castad's way now). The Python writers go through SQLAlchemy as the services do; "
        "pgbench (PostgreSQL's C client, same statements) shows the server's side without the Python cost."
    )
    add("")
    add("| writers | none (commits/s) | after_commit | in_transaction | after_commit / in_transaction |")
    add("|---|---|---|---|---|")
    t = py["totals"]
    add(
        f"| Python, {py['threads']} threads | {_f(t['none']['rate'], 0)} | {_f(t['after_commit']['rate'], 0)} "
        f"| {_f(t['in_transaction']['rate'], 0)} | {_ratio(t['after_commit']['rate'], t['in_transaction']['rate'])} |"
    )
    pgb = notify.get("pgbench")
    if pgb:
        t = pgb["totals"]
        add(
            f"| pgbench, {pgb['threads']} clients | {_f(t['none']['rate'], 0)} | {_f(t['after_commit']['rate'], 0)} "
            f"| {_f(t['in_transaction']['rate'], 0)} "
            f"| {_ratio(t['after_commit']['rate'], t['in_transaction']['rate'])} |"
        )
    add("")
    t = py["totals"]
    add(
        "Python writers, latency of one transaction (p50 / p99 ms): "
        + "; ".join(f"{v}: {_f(t[v]['latency_p50_ms'], 2)} / {_f(t[v]['latency_p99_ms'], 2)}" for v in t)
        + ". Rates per round: "
        + "; ".join(f"{v}: {', '.join(_f(x, 0) for x in t[v]['round_rates'])}" for v in t)
        + "."
    )
    if pgb:
        t = pgb["totals"]
        add(
            f"pgbench ({pgb['pgbench']}) average latency (ms): "
            + "; ".join(f"{v}: {_f(t[v]['latency_avg_ms'], 2)}" for v in t)
            + ". Rates per round: "
            + "; ".join(f"{v}: {', '.join(_f(x, 0) for x in t[v]['round_rates'])}" for v in t)
            + "."
        )
    add("")
    add(
        "A NOTIFY makes PostgreSQL take one lock for the whole cluster at COMMIT and hold it until the "
        "commit is done (its WAL flush included), so that notifications queue in commit order: writers "
        "that notify inside their transaction commit one at a time. After the commit, the NOTIFY is a "
        "transaction of its own that changes nothing, so its commit does not wait for a WAL flush and "
        "holds the lock only briefly, at the price of another round trip per transaction. The pgbench row "
        "shows the server's side; the Python row what Castad's own writers see. Castad now notifies inside "
        "the transaction, from a trigger on the outbox (and on the gateway's timeline): in the whole pipeline "
        "(A) the round trip and the extra transaction it saves cost more than the serialised commits, which "
        "only matter at commit rates far above Castad's; see the changes measured under A."
    )
    add("")

    add("## How to reproduce")
    add("")
    add("```")
    add("make bench                        # = .venv/bin/python -m bench.run; rewrites docs/reports/benchmarks.md")
    add(".venv/bin/python -m bench.run --help   # sizes: --pipelines, --idle, --concurrency, --notify-per-thread, ...")
    add("```")
    add("")
    add(
        "It needs PostgreSQL (127.0.0.1:5432, user postgres) and RabbitMQ (127.0.0.1:5672) as `make setup` "
        "leaves them, takes a few minutes, and removes its databases, queues, processes and files at the "
        "end, also on Ctrl-C or an error (then the services' logs stay in `var/bench/<run>/logs`). The raw "
        "figures of the last run are in `var/bench/last-run.json`. Run it on an otherwise idle machine for "
        "figures that compare across runs."
    )
    add("")
    return "\n".join(lines)
