"""Facts about the machine and the servers a run measured."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import statistics
import time
from importlib import metadata
from typing import Any

import pika
import psycopg

from castad_testkit import scratch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def postgres() -> dict[str, str]:
    def one(conn: psycopg.Connection[Any], query: str) -> str:
        row = conn.execute(query).fetchone()
        return "?" if row is None else str(row[0])

    with psycopg.connect(scratch.admin_dsn(), autocommit=True) as conn:
        facts = {"version": " ".join(one(conn, "SELECT version()").split()[:2])}
        for name in (
            "synchronous_commit",
            "fsync",
            "wal_sync_method",
            "max_connections",
            "shared_buffers",
            "checkpoint_timeout",
            "autovacuum",
        ):
            facts[name] = one(conn, f"SHOW {name}")
    return facts


def postgres_round_trip_ms(samples: int = 100, pause_s: float = 0.01) -> dict[str, float]:
    """Median `SELECT 1` round trip back to back ("hot") and after `pause_s` idle ("after a pause").

    On a virtual machine a process that slept must be woken first, which a round trip
    after a pause pays (every step of an idle handoff is such a round trip).
    """
    with psycopg.connect(scratch.admin_dsn(), autocommit=True) as conn:
        hot, paused = [], []
        for _ in range(samples):
            started = time.perf_counter()
            conn.execute("SELECT 1")
            hot.append(time.perf_counter() - started)
        for _ in range(samples):
            time.sleep(pause_s)
            started = time.perf_counter()
            conn.execute("SELECT 1")
            paused.append(time.perf_counter() - started)
    return {"hot": statistics.median(hot) * 1000, "after_pause": statistics.median(paused) * 1000}


def rabbitmq() -> str:
    connection = pika.BlockingConnection(pika.URLParameters(scratch.AMQP_URL))
    try:
        properties: dict[Any, Any] = connection._impl.server_properties  # no public accessor in pika
        version = properties.get("version", b"?")
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        connection.close()


def _memory_gib() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            match = re.search(r"MemTotal:\s+(\d+) kB", meminfo.read())
        return f"{int(match.group(1)) / 2**20:.1f} GiB" if match else "?"
    except OSError:
        return "?"


def brief_facts(load_at_start: tuple[float, float, float]) -> dict[str, object]:
    """What a micro-benchmark's report says of the machine: when, its cores and CPU, PostgreSQL, how busy it was."""
    server = postgres()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "postgres": f"{server['version']}, synchronous_commit {server['synchronous_commit']}",
        "load": " / ".join(f"{value:.2f}" for value in load_at_start),
    }


def facts() -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "memory": _memory_gib(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "postgres": postgres(),
        "postgres_round_trip_ms": postgres_round_trip_ms(),
        "rabbitmq": rabbitmq(),
        "packages": {name: metadata.version(name) for name in ("dramatiq", "pika", "psycopg", "sqlalchemy", "aiormq")},
    }
