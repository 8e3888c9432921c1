"""What each service costs to start and to keep: seconds until it is ready, and resident memory, idle and after work.

Each service is started `ROUNDS` times alone as `make up` starts it (its own process, the local providers), timed
from its start to its readiness probe answering 200; its resident memory (its process and its children) is read
`SETTLE_S` after. Then the whole stack runs one brief in each language, and every service's memory is read when
the last ends, and again once the song service's Japanese reader has been idle past its `IDLE_S` (a child process
that gives its memory back). The measurements are kept in docs/reports/footprint.json and the page,
docs/reports/footprint.md, is written from them by bench/templates/footprint.md.j2 (`make bench-footprint`,
about 5 minutes; `--render` writes the page again from the measurements alone).
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
import time
from typing import Any

import httpx
from castad_contracts import brief, topology
from castad_local import stack as stack_
from castad_song import reading
from castad_testkit import briefs, machine, scratch

from bench import castad_bench, pages

ROUNDS = 3
SETTLE_S = 10.0  # after readiness: what a service holds once started, before any work
READY_TIMEOUT_S = 120.0
LANGUAGES = briefs.LANGUAGES
AFTER_IDLE_S = reading.IDLE_S + 15.0


def tree_rss_mb(pid: int) -> float:
    """Resident memory of the process `pid` and of every process below it, in MiB (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    total_kb, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = (pathlib.Path("/proc") / str(current) / "status").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        todo += children.get(current, [])
    return total_kb / 1024


class Footprint(castad_bench.CastadBench):
    """The benchmark's Castad with the local providers (a real song, a real video), each worker's probes on a port."""

    def __init__(self, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> None:
        super().__init__(cleanup, workdir)
        self.probes = {service: stack_.free_port() for service in topology.WORKERS}

    def env(self) -> dict[str, str]:
        env = super().env()
        for stage in topology.STAGES:
            env.pop(f"CASTAD_{stage.upper()}_PROVIDER")
        env["CASTAD_VIDEO_SHORT_SIDE"] = "144"  # small media, as the tests make them
        return env | {f"CASTAD_{service.upper()}_HEALTH_PORT": str(port) for service, port in self.probes.items()}

    def brief_of(self, number: int) -> brief.Brief:
        """The fault harness's briefs, the `number`th in LANGUAGES' `number`th language, of 10 s songs."""
        sample = briefs.sample(number=number, duration_s=10)
        assert sample.language is LANGUAGES[number], (number, sample.language)
        return sample

    def ready_url(self, service: str) -> str:
        return f"{self.base_url}/readyz" if service == "api" else f"http://127.0.0.1:{self.probes[service]}/readyz"


def wait_ready(url: str, process: Any) -> float:
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT_S:
        if process.poll() is not None:
            raise RuntimeError(f"the service of {url} exited with {process.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready within {READY_TIMEOUT_S:g} s")


def starts(castad: Footprint) -> dict[str, dict[str, float]]:
    """Each service started alone `ROUNDS` times: the median seconds to ready and resident MiB `SETTLE_S` after."""
    measured: dict[str, dict[str, float]] = {}
    for service in topology.SERVICES:
        seconds, memory = [], []
        for _ in range(ROUNDS):
            services = stack_.Stack(castad.env(), castad.log_dir)
            services.start(service)
            try:
                process = services.processes[service]
                seconds.append(wait_ready(castad.ready_url(service), process))
                time.sleep(SETTLE_S)
                memory.append(tree_rss_mb(process.pid))
            finally:
                services.stop_all()
        measured[service] = {"ready_s": statistics.median(seconds), "idle_mb": statistics.median(memory)}
        scratch.log.info("footprint: %s ready in %.2f s, %.0f MiB idle", service, *measured[service].values())
    return measured


def after_work(castad: Footprint) -> dict[str, dict[str, float]]:
    """Every service's resident MiB when a brief in each language has ended, and after the reader's idle time."""
    castad.start()
    assert castad.stack is not None
    records = [castad.submit(number) for number in range(len(LANGUAGES))]
    for record, language in zip(records, LANGUAGES, strict=True):
        if (ended := castad.follow(record)) != "SUCCEEDED":
            raise RuntimeError(f"the {language.value} brief ended {ended}; logs in {castad.log_dir}")
    busy = {name: tree_rss_mb(process.pid) for name, process in castad.stack.processes.items()}
    time.sleep(AFTER_IDLE_S)
    idle = {name: tree_rss_mb(process.pid) for name, process in castad.stack.processes.items()}
    return {name: {"after_mb": busy[name], "later_mb": idle[name]} for name in busy}


def render(measured: dict[str, Any]) -> str:
    """The page, from the template and the measurements."""
    return pages.render(
        "footprint.md.j2",
        **measured,
        services=list(topology.SERVICES),
        languages=[language.value for language in LANGUAGES],
        idle_s=reading.IDLE_S,
        settle_s=SETTLE_S,
        rounds=ROUNDS,
        after_idle_s=AFTER_IDLE_S,
    )


def measure() -> dict[str, Any]:
    """Start every service alone and again after work; return the measurements the page is written from."""
    load = machine.load()
    cleanup = scratch.Cleanup()
    with scratch.interrupt_on_sigterm(), cleanup.scope(), tempfile.TemporaryDirectory(prefix="footprint-") as work:
        castad = Footprint(cleanup, pathlib.Path(work))
        castad.setup()
        measured = {"starts": starts(castad), "work": after_work(castad)}
    return {**measured, "facts": machine.brief_facts(load)}


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("footprint", __doc__)
    args = parser.parse_args(argv)
    pages.write(args.output, render, None if args.render else measure())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
