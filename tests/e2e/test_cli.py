"""The `castad` command against a running gateway.

Every error is one line and an exit status, never a traceback; cancel, retry and dead letters work from the command
line.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid

import pytest
from castad_local import stack
from castad_testkit import briefs

from tests.support.installation import TEST_KEYS

pytestmark = pytest.mark.e2e

CASTAD = str(pathlib.Path(sys.executable).with_name("castad"))


def cli(gateway: str, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    """`castad` with the tests' admin key (`key`: another one; "": none at all)."""
    key = TEST_KEYS.get("admin", "") if key is None else key
    env = {**os.environ, "CASTAD_API_KEY": key, "CASTAD_API_KEY_FILE": "/nonexistent"}
    return subprocess.run(
        [CASTAD, "--gateway", gateway, "--actor", "cli-test", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("castad: ") and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_every_error_is_one_line_and_its_own_exit_status():
    down = f"http://127.0.0.1:{stack.free_port()}"
    one_line_error(cli(down, "status", str(uuid.uuid4())), 3, "cannot reach the gateway")
    one_line_error(cli(down, "cancel", str(uuid.uuid4())), 3, "cannot reach the gateway")
    one_line_error(cli(down, "dead-letters", "list"), 3, "cannot reach the gateway")
    one_line_error(cli(down, "timeline", str(uuid.uuid4())), 3, "cannot reach the gateway")
    one_line_error(cli(down, "stats", "--window", "15m"), 3, "cannot reach the gateway")
    one_line_error(cli(down, "usage"), 3, "cannot reach the gateway")
    one_line_error(cli(down, "retry", str(uuid.uuid4()), "--max-attempts", "lyrics=2"), 2, "STAGE=N")
    both = cli(down, "download", str(uuid.uuid4()), "--captions", "vtt", "--poster")
    one_line_error(both, 2, "give one of them")


@pytest.mark.timeout(180)
def test_cancel_retry_and_dead_letters_from_the_command_line(shared):
    running, gateway = shared, shared.base_url
    running.faults("lyric", hang_rate=1)

    one_line_error(cli(gateway, "status", str(uuid.uuid4())), 4, "404: no pipeline")
    one_line_error(cli(gateway, "status", str(uuid.uuid4()), key=""), 7, "401: an API key is needed")
    one_line_error(cli(gateway, "status", str(uuid.uuid4()), key="cad_wrong"), 7, "401: the API key is unknown")
    one_line_error(cli(gateway, "status", "not-a-pipeline-id"), 2, "422")
    one_line_error(cli(gateway, "dead-letters", "show", "424242"), 4, "no dead letter")

    hanging = running.submit(briefs.sample("걸린 가게"))
    canceled = cli(gateway, "cancel", hanging, "--reason", "changed my mind")
    assert canceled.returncode == 0 and f"pipeline {hanging}: CANCELING (cancel #1 requested)" in canceled.stdout
    assert running.wait_terminal([hanging])[hanging].status == "CANCELED"

    running.faults("lyric")  # the cause is fixed
    retried = cli(gateway, "retry", hanging, "--max-attempts", "lyric=3", "--watch")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert f"pipeline {hanging}: RUNNING again from lyric (retry #2)" in retried.stdout
    assert "done" in retried.stdout
    one_line_error(cli(gateway, "cancel", hanging), 5, "has already ended SUCCEEDED")
    one_line_error(cli(gateway, "retry", hanging), 5, "only a FAILED or CANCELED pipeline")

    used = cli(gateway, "usage", "--tenant", running.tenant)  # the pipeline made, counted for its tenant
    assert used.returncode == 0 and running.tenant in used.stdout and "per day" in used.stdout, used.stderr
    assert "total" in used.stdout and "Traceback" not in used.stderr
    one_line_error(cli(gateway, "usage", "--from", "2026-12-05", "--to", "2026-12-01"), 2, "query.from")

    listed = cli(gateway, "dead-letters", "list", "--status", "dead")
    assert listed.returncode == 0 and "0 dead letters" in listed.stdout
    one_line_error(cli(gateway, "dead-letters", "replay"), 2, "give dead letter ids, or --all")
