"""Tracing's set-up: spans are recorded only where they are exported, and trace context passes on either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os
from castad_runtime import telemetry
telemetry.setup("lyric")
tracer = telemetry.tracer("probe")
with tracer.start_as_current_span("root") as root:
    sent, recording = telemetry.current_trace_headers(), [root.is_recording()]
with tracer.start_span("next hop", context=telemetry.context_from(*sent)) as hop:
    passed_on = telemetry.current_trace_headers(hop)
    recording.append(hop.is_recording())
print(json.dumps({"recording": recording, "sent": sent[0], "passed_on": passed_on[0]}))
os._exit(0)  # no flush to the (absent) collector at exit
"""


def probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("env", "recording"),
    [
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({}, False),  # no endpoint: nothing to export to
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_PROPAGATORS": "none"}, False),  # envelopes carry W3C's anyway
    ],
    ids=["exporter-none", "no-endpoint", "exporting", "no-global-propagator"],
)
def test_spans_are_recorded_only_when_exported_and_the_trace_goes_on_either_way(env, recording):
    result = probe(**env)

    assert result["recording"] == [recording, recording]
    sent, passed_on = str(result["sent"]).split("-"), str(result["passed_on"]).split("-")
    assert sent[1] == passed_on[1] and int(sent[1], 16) != 0  # the same trace id
    assert sent[2] != passed_on[2]  # the next hop's own span id
