"""The freezes whose moment has to be found first: a process stopped (SIGSTOP) mid-attempt or in a transaction.

A song replica is stopped in an attempt not yet submitted, for longer than its lease; a replica of a stage, of the
gateway and a relay each inside a transaction holding row locks, for longer than such a session may wait.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from castad_local import stack as stack_
from castad_testkit import scratch

from castad_faults import deployment, injections, outcome, plan
from castad_faults.injector import WORKS_AGAIN_S, Injector

log = logging.getLogger("castad_faults")
FREEZE_TRIES = 20  # attempts seen before their submit, each stopped and let go again if it moved on meanwhile
# Stopped at a moment one of their sessions holds row locks. The relay is stopped otherwise: its sessions commit each
# statement on its own but for a refusal's, so it is stopped inside the refusal of a row the harness adds.
FROZEN_IN_TRANSACTION_SERVICES = ("song", "api")
REFUSAL_DUE_S = 1.0  # the row the relay is stopped on is due this long after it is added, once its lock is held
# The relay's session waits on that lock: whose it is (the row's lock held by the harness's own session).
WAITING_ON_THE_ROW = (
    "SELECT pid, application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND application_name LIKE 'castad:%%' AND %(holder)s = ANY(pg_blocking_pids(pid))"
)
IN_TRANSACTION_TRIES = 600  # stops of a process, each let go again at once if no session of its held row locks
# Sessions of Castad's processes inside a transaction that holds row locks (an id of their transaction: they wrote or
# locked a row); application_name is `castad:<pid>@<host>` (castad_runtime.db.application_name). A process is
# stopped only once one of its sessions is seen so (most of its transactions last milliseconds: stopped at random
# moments, a gateway replica took 300-600 stops to be caught inside one), and kept stopped if the session then waits
# for its next statement.
WRITING = (
    "SELECT pid, application_name, state FROM pg_stat_activity"
    " WHERE backend_xid IS NOT NULL AND application_name LIKE 'castad:%'"
)


def freeze_a_stage_replica_mid_attempt(injector: Injector) -> None:
    """SIGSTOP a song replica in an attempt not yet submitted, for longer than its lease; then SIGCONT.

    The attempt has not submitted its work to the music API yet. Another replica takes the attempt over and
    submits; the frozen one, woken, must send nothing (its fence).
    """
    job_id, worker, attempt, name = _stop_a_song_replica_before_its_submit(injector)
    injector.frozen_job = ("song", job_id, worker, attempt)
    injector.record(
        "stage replica frozen",
        name,
        lambda: None,  # stopped already, once its attempt was seen still before its submit
        plan.STAGE_FREEZE_S,
        lambda: injector.stack.signal(name, signal.SIGCONT),
        detail=f"song job {job_id}, attempt {attempt}, before its submit",
        takeover_bound_s=plan.STAGE_FREEZE_S,  # another replica took the job over before the wake-up
    )


def _stop_a_song_replica_before_its_submit(injector: Injector) -> tuple[str, str, int, str]:
    """SIGSTOP the song replica of an attempt before its submit: the job, worker, attempt and process.

    The attempt may end or submit between the look and the signal (an injected failure ends it as its latency
    ends), or the replica may stop inside a transaction on the job's row (recording that failure): then it
    goes on and another attempt is chosen. Such a freeze is a fault of its own (`freeze_inside_transactions`):
    this one measures the takeover of an attempt by its lease.
    """
    with psycopg.connect(scratch.dsn(injector.urls["song"]), autocommit=True) as conn:
        for _ in range(FREEZE_TRIES):
            job_id, worker, attempt = _song_attempt_before_its_submit(injector)
            name = injector.stack.process_of(worker)
            injector.stack.signal(name, signal.SIGSTOP)
            if _still_before_its_submit(conn, job_id, worker, attempt):
                return job_id, worker, attempt, name
            injector.stack.signal(name, signal.SIGCONT)
    raise RuntimeError(f"no song attempt stopped before its submit in {FREEZE_TRIES} tries")


def _still_before_its_submit(conn: psycopg.Connection[Any], job_id: str, worker: str, attempt: int) -> bool:
    """Whether the attempt is still under way with nothing submitted, its job's row locked by no transaction."""
    try:
        with conn.transaction():
            row = conn.execute(
                "SELECT 1 FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.number = j.attempts"
                " WHERE j.id = %s AND j.status = 'RUNNING' AND j.attempts = %s AND j.lease_owner = %s"
                " AND j.handle IS NULL AND a.submitted_at IS NULL FOR UPDATE OF j NOWAIT",
                (job_id, attempt, worker),
            ).fetchone()
    except psycopg.errors.LockNotAvailable:
        return False
    return row is not None


def _song_attempt_before_its_submit(injector: Injector) -> tuple[str, str, int]:
    """A song job, the worker and the number of its attempt under way that has no handle yet.

    Its work is about to be submitted: the fault injector's latency holds it there a moment.
    """
    deadline = time.monotonic() + 120
    with psycopg.connect(scratch.dsn(injector.urls["song"]), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT id, lease_owner, attempts FROM jobs WHERE status = 'RUNNING' AND handle IS NULL"
                " AND lease_expires_at > now() + interval '1 second' ORDER BY lease_expires_at DESC LIMIT 1"
            ).fetchone()
            if row is not None:
                return str(row[0]), str(row[1]), int(row[2])
            time.sleep(0.02)
    raise RuntimeError("no song attempt about to submit within 120 s")


def freeze_inside_transactions(injector: Injector) -> None:
    """A replica of each of FROZEN_IN_TRANSACTION_SERVICES, and a relay, stopped inside a transaction holding rows.

    Each stays stopped longer than PostgreSQL lets a session wait idle inside a transaction: PostgreSQL ends its
    session, which lets go of its row locks, and the work that waited on them goes on; the process, woken, finds
    that connection gone and goes on as after an outage. The plan's `together` freezes them side by side, each
    found and let go on its own (each one's moment depends on the others' work going on).
    """
    stops: list[Callable[[], tuple[outcome.Fault, str, int]]] = [
        functools.partial(_stop_inside_a_transaction, injector, deployment.Deployment.names(service)[0])
        for service in FROZEN_IN_TRANSACTION_SERVICES
    ]
    stops.append(functools.partial(_stop_a_relay_inside_a_refusal, injector))
    batches = [stops] if injector.plan.together else [[stop] for stop in stops]
    for batch in batches:
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            frozen = list(pool.map(functools.partial(_freeze_inside_a_transaction, injector), batch))
        injector.faults += frozen
        injector.after(frozen)


def _freeze_inside_a_transaction(
    injector: Injector, stop: Callable[[], tuple[outcome.Fault, str, int]]
) -> outcome.Fault:
    """Stop a process inside a transaction holding row locks for FROZEN_IN_TRANSACTION_S, then let it go on.

    `stop` stops it: the fault, and the database URL and backend pid of that session. Its `takeover_s`: from the
    stop until that session was ended.
    """
    fault, url, backend = stop()
    name = fault.target
    states: list[str] = []  # what the session did meanwhile, each change once
    with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
        while time.time() < fault.started + plan.FROZEN_IN_TRANSACTION_S:
            state = _session_state(conn, backend)
            if state is None and fault.takeover_s is None:
                fault.takeover_s = time.time() - fault.started
            elif state is not None and state not in states:
                states.append(state)
            time.sleep(0.1)
    injector.stack.signal(name, signal.SIGCONT)
    fault.ended = time.time()
    ended = "more than the freeze" if fault.takeover_s is None else f"{fault.takeover_s:.1f} s"
    fault.detail += f"; the session was {', then '.join(states)}; it was ended after {ended}"
    return fault


def _stop_inside_a_transaction(injector: Injector, name: str) -> tuple[outcome.Fault, str, int]:
    """Stop the process `name` at a moment a session of its holds row locks inside a transaction.

    Stopped, then let go again at once if none does, until one does. The fault, and the database URL and backend
    pid of that session.
    """
    group = injector.stack.processes[name].pid
    service = stack_.service_of(name)
    urls = dict(injector.urls) if service == "relay" else {service: injector.urls[service]}
    with contextlib.ExitStack() as opened:
        conns = {
            db: opened.enter_context(psycopg.connect(scratch.dsn(url), autocommit=True)) for db, url in urls.items()
        }
        deadline = time.monotonic() + WORKS_AGAIN_S
        tries = 0
        while tries < IN_TRANSACTION_TRIES and time.monotonic() < deadline:
            if not _writing(conns, group):
                time.sleep(0.005)
                continue
            tries += 1
            injector.stack.signal(name, signal.SIGSTOP)
            started, held = time.time(), None
            try:
                time.sleep(0.05)  # a statement it had sent ends; its session then waits for the next
                held = next((s for s in _writing(conns, group) if s[2] == "idle in transaction"), None)
            finally:
                if held is None:
                    injector.stack.signal(name, signal.SIGCONT)
            if held is not None:
                database, backend, _ = held
                detail = f"its session {backend} in the {database} database held row locks ({tries} tries)"
                log.info("faults: %s of %s: %s", outcome.FROZEN_IN_TRANSACTION, name, detail)
                fault = outcome.Fault(outcome.FROZEN_IN_TRANSACTION, name, started, detail=detail)
                fault.takeover_bound_s = plan.IN_TRANSACTION_RELEASE_S
                return fault, urls[database], backend
    raise RuntimeError(
        f"{name} held no row locks at any of {tries} stops (at most {IN_TRANSACTION_TRIES}, or {WORKS_AGAIN_S:g} s)"
    )


def _writing(conns: Mapping[str, psycopg.Connection[Any]], group: int) -> list[tuple[str, int, str]]:
    """Sessions (database, backend pid, state) of the process group `group` in transactions holding row locks."""
    return [
        (database, backend, state)
        for database, conn in conns.items()
        for backend, application, state in conn.execute(WRITING).fetchall()
        if _process_group(application) == group
    ]


def _stop_a_relay_inside_a_refusal(injector: Injector) -> tuple[outcome.Fault, str, int]:
    """Stop the relay that refuses a row of the gateway's outbox inside its refusal's transaction.

    The harness adds a row no service may publish (due a moment later) and locks it. The relay leading that
    outbox tells the operators, then waits on the lock to park it: it is stopped (SIGSTOP) there, and the lock let
    go. Its statement then parks the row, and its session holds that row's lock idle in the transaction: the
    relay that takes the outbox over must not park the row twice, nor tell the operators twice.
    """
    url = injector.urls["api"]
    probe = injections.add_unroutable_row(url, due_in_s=REFUSAL_DUE_S)
    injector.probes.append(probe)
    injector.frozen_refusal = probe
    with psycopg.connect(scratch.dsn(url), autocommit=True) as watcher, psycopg.connect(scratch.dsn(url)) as holder:
        holder.execute("SELECT 1 FROM outbox WHERE event_id = %s FOR UPDATE", (probe,))
        holder_pid = holder.info.backend_pid
        deadline = time.monotonic() + WORKS_AGAIN_S
        while time.monotonic() < deadline:
            for backend, application in watcher.execute(WAITING_ON_THE_ROW, {"holder": holder_pid}).fetchall():
                group = _process_group(application)
                name = next((n for n, process in injector.stack.processes.items() if process.pid == group), "")
                if stack_.service_of(name) != "relay":
                    continue
                injector.stack.signal(name, signal.SIGSTOP)
                started = time.time()
                holder.rollback()  # the lock let go: the stopped relay's statement parks the row
                detail = f"its session {backend} waited to park the row {probe} the harness had locked"
                log.info("faults: %s of %s: %s", outcome.FROZEN_IN_TRANSACTION, name, detail)
                fault = outcome.Fault(outcome.FROZEN_IN_TRANSACTION, name, started, detail=detail)
                fault.takeover_bound_s = plan.IN_TRANSACTION_RELEASE_S
                return fault, url, backend
            time.sleep(0.02)
    raise RuntimeError(f"no relay waited to park the row {probe} within {WORKS_AGAIN_S:g} s")


def _session_state(conn: psycopg.Connection[Any], backend: int) -> str | None:
    """What a session does (its state, what it waits for, its statement's first words); None once it is gone."""
    row = conn.execute(
        "SELECT state, wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity WHERE pid = %s", (backend,)
    ).fetchone()
    if row is None:
        return None
    state, kind, event, query = row
    return f"{state}{f' ({kind} {event})' if kind else ''} after `{' '.join(query.split())}`"


def _process_group(application_name: str) -> int | None:
    """The process group of the process a session's application_name (`castad:<pid>@<host>`) names; None if gone."""
    try:
        return os.getpgid(int(application_name.split(":", 1)[1].split("@", 1)[0]))
    except (ValueError, ProcessLookupError):
        return None
