"""How long one gateway process takes to deliver webhook notices to a receiver answering in 1 s.

The code before notices were sent several at once, and the code of this tree.

A scratch database is migrated as the gateway's and given `--notices` due notices, all to one receiver on
127.0.0.1 (a threaded HTTP server that answers 204 after `--answer-s`); the gateway's deliverer (its defaults
but for private addresses, allowed for the local receiver) runs until every notice is delivered, or for at
most `--max-s`, then stops. The code before is run from a temporary checkout of `--before` (its gateway,
runtime and contracts packages first on the path); as it sends one notice at a time, a thousand would take
a thousand seconds, so it is given `--before-notices` and what a thousand would take is projected from its
rate, and said to be. Each measurement runs in a process of its own. Writes docs/reports/webhooks.md by
bench/templates/webhooks.md.j2, the measurements kept beside it in webhooks.json (`make bench-webhooks`;
`--render` writes the page again from them).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.server
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from castad_testkit import machine, scratch

from bench import pages

BEFORE = "147662a1567ddbdf406ea0e0e794f366ccc7c036"  # the last commit whose gateway sent one notice at a time
TARGET_S = 30.0  # the bound for a thousand notices to a receiver answering in 1 s
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver(http.server.ThreadingHTTPServer):
    """Answers every POST 204 after `answer_s`, counting them and the most it held at once."""

    daemon_threads = True
    request_queue_size = 1024  # the deliverer connects dozens at once: none may wait for a SYN retry

    def __init__(self, answer_s: float) -> None:
        self.answer_s = answer_s
        self.lock = threading.Lock()
        self.received = 0
        self.now = 0
        self.peak = 0
        super().__init__(("127.0.0.1", 0), _Answer)


class _Answer(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.lock:
            self.server.now += 1
            self.server.peak = max(self.server.peak, self.server.now)
        time.sleep(self.server.answer_s)
        self.send_response(204)
        self.end_headers()
        with self.server.lock:
            self.server.now -= 1
            self.server.received += 1

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def measure(notices: int, answer_s: float, max_s: float) -> dict[str, Any]:
    """Deliver `notices` due notices with the gateway's deliverer (the one on the path) to a local receiver."""
    import sqlalchemy as sa
    from castad_api import settings
    from castad_local import stack
    from castad_runtime import migrations

    try:
        from castad_api.webhook_deliverer import Deliverer
    except ImportError:  # the release measured "before" kept the deliverer in castad_api.webhooks
        from castad_api.webhooks import Deliverer  # type: ignore[attr-defined,no-redef]

    url = scratch.database_url(f"castad_bench_webhooks_{scratch.RUN_ID}")
    receiver = Receiver(answer_s)
    threading.Thread(target=receiver.serve_forever, name="receiver", daemon=True).start()
    cleanup = scratch.Cleanup()
    with cleanup.scope():
        cleanup.push("stop the receiver", receiver.shutdown)
        migrations.ensure_database(url)
        cleanup.push("drop the scratch database", lambda: migrations.drop_database(url))
        migrations.upgrade(url, next(d.migrations_dir for d in stack.DATABASES if d.service == "api"))
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        cleanup.push("close the engine", engine.dispose)
        target = f"http://127.0.0.1:{receiver.server_address[1]}/hooks"
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO webhook_deliveries (id, pipeline_id, url, event_type, payload)"
                    " SELECT gen_random_uuid(), gen_random_uuid(), :url, 'pipeline.succeeded',"
                    " jsonb_build_object('type', 'pipeline.succeeded', 'n', n) FROM generate_series(1, :n) AS n"
                ),
                {"url": target, "n": notices},
            )
        config = settings.ApiSettings(database_url=url, webhook_secret=SECRET, webhook_allow_private=True)
        deliverer = Deliverer(sa.create_engine(url, pool_size=4), config)
        started = time.monotonic()
        deliverer.start()
        delivered = 0
        try:
            while delivered < notices and time.monotonic() - started < max_s:
                time.sleep(0.1)
                with engine.connect() as conn:
                    delivered = conn.scalar(
                        sa.text("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")
                    )
            elapsed = time.monotonic() - started
        finally:
            deliverer.stop()
            deliverer.engine.dispose()
    return {
        "notices": notices,
        "delivered": delivered,
        "seconds": round(elapsed, 2),
        "received": receiver.received,
        "peak_at_once": receiver.peak,
        "answer_s": answer_s,
        "settings": {
            name: getattr(config, name)
            for name in ("webhook_concurrency", "webhook_per_host", "webhook_poll_s", "webhook_timeout_s")
            if hasattr(config, name)
        },
    }


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[pathlib.Path]:
    """A temporary worktree of `revision`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="castad-before-") as temporary:
        tree = pathlib.Path(temporary) / "tree"
        subprocess.run(
            ["git", "-C", str(scratch.REPO_ROOT), "worktree", "add", "--detach", "--quiet", str(tree), revision],
            check=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(scratch.REPO_ROOT), "worktree", "remove", "--force", str(tree)], check=False
            )


def with_code_of(tree: pathlib.Path | None) -> dict[str, str]:
    """The environment of a process that runs the gateway of `tree` (None: of this tree, as installed).

    Every package is that of `tree` (the gateway, the libraries, the local tooling and the services it names), so
    none of this tree's mixes with the older code.
    """
    env = dict(os.environ)
    if tree is not None:
        packages = sorted(path.parent for path in tree.glob("*/*/pyproject.toml"))
        env["PYTHONPATH"] = os.pathsep.join([*map(str, packages), env.get("PYTHONPATH", "")])
    return env


def run_child(notices: int, answer_s: float, max_s: float, tree: pathlib.Path | None) -> dict[str, Any]:
    """One measurement in a process of its own, with the gateway of `tree` (None: this tree's) on the path."""
    env = with_code_of(tree)
    argv = [sys.executable, "-m", "bench.webhooks", "--child", str(notices), "--answer-s", str(answer_s)]
    done = subprocess.run(
        [*argv, "--max-s", str(max_s)],
        cwd=scratch.REPO_ROOT,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=max_s + 120,  # migrations and clean-up besides the run itself
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/webhooks.md.j2 from the measurements."""
    before, after = measured["before"], measured["after"]
    return pages.render(
        "webhooks.md.j2",
        **measured,
        projected_s=measured["notices"] / (before["delivered"] / before["seconds"]),
        met=after["delivered"] == after["notices"] and after["seconds"] <= measured["target_s"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("webhooks", __doc__)
    parser.add_argument("--notices", type=int, default=1000)
    parser.add_argument("--before-notices", type=int, default=30, help="given to the code before (one at a time)")
    parser.add_argument("--answer-s", type=float, default=1.0, help="the receiver's time to answer")
    parser.add_argument("--max-s", type=float, default=120.0, help="the longest one measurement runs")
    parser.add_argument("--before", default=BEFORE, help="the commit of the code before")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # a measurement of this many, as JSON
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(measure(args.child, args.answer_s, args.max_s)))
        return 0
    measured: dict[str, Any] | None = None
    if not args.render:
        with scratch.interrupt_on_sigterm():
            with checkout(args.before) as tree:
                before = run_child(args.before_notices, args.answer_s, args.max_s, tree)
            after = run_child(args.notices, args.answer_s, args.max_s, None)
        measured = {
            "date": dt.date.today().isoformat(),
            "answer_s": args.answer_s,
            "before_commit": args.before,
            "notices": args.notices,
            "target_s": TARGET_S,
            "before": before,
            "after": after,
            "facts": machine.facts(),
        }
    pages.write(args.output, render, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
