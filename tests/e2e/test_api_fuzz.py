"""The gateway against requests generated from its own OpenAPI document (schemathesis).

The gateway runs as its own process on a real PostgreSQL. With a valid key, over a thousand requests and not one
5xx, every answer's status, content type and body as the document says; without a key, a 401 from every route but
the probes and /metrics, and the console's static files at /ui (outside the document).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import RunningCastad, castad_of

pytestmark = pytest.mark.e2e
SCHEMATHESIS = str(pathlib.Path(sys.executable).with_name("schemathesis"))
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
PROBES = {"/healthz", "/readyz", "/metrics"}  # unauthenticated: they name no pipeline and no tenant
# Unauthenticated too, and no part of the document: the console's files, which hold no data (the page
# asks for a key and sends it with every API call).
CONSOLE = ("/ui/", "/ui/js/main.js", "/ui/console.css")


@pytest.fixture(scope="module")
def gateway(migrated_templates, tmp_path_factory) -> Iterator[RunningCastad]:
    """The gateway alone, for the module (pipelines it accepts wait for stages that are not running)."""
    # The streams close after 0.2 s (no stage runs, so no pipeline ends), so that each request for one gets its
    # whole answer soon: a pipeline's, whose id schemathesis took from an earlier answer, or every pipeline's.
    # The limit of failed authentications per address (tests/integration/test_authentication.py) stays out of the
    # way: schemathesis and the keyless test after it all come from 127.0.0.1, and a 429 is no answer they check.
    env = {
        "CASTAD_API_FIREHOSE_MAX_S": "0.2",
        "CASTAD_API_STREAM_MAX_S": "0.2",
        "CASTAD_API_AUTH_FAILURE_BURST": "100000",
    }
    with castad_of(migrated_templates, tmp_path_factory.mktemp("fuzz"), env, only=("api",)) as running:
        yield running


@pytest.mark.timeout(600)
def test_a_thousand_generated_requests_get_no_5xx_and_answers_that_fit_the_document(gateway):
    run = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{gateway.base_url}/openapi.json",
            "--header",
            f"Authorization: Bearer {gateway.installation.api_key}",
            "--checks",
            CHECKS,
            "--max-examples",
            "15",
            "--generation-deterministic",
            "--phases",
            "examples,coverage,fuzzing",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    summary = run.stdout[-6000:]
    assert run.returncode == 0, summary
    generated = re.search(r"(\d+) generated", run.stdout)
    assert generated is not None and int(generated.group(1)) >= 1000, summary
    assert gateway.installation.api_key not in run.stdout  # the key is filtered from what it prints


def test_without_a_key_every_route_but_the_probes_metrics_and_the_console_answers_401(gateway):
    document = httpx.get(f"{gateway.base_url}/openapi.json").json()
    values = {
        "pipeline_id": str(uuid.uuid4()),
        "letter_id": "1",
        "stage": "video",
        "image_id": str(uuid.uuid4()),
        "photo": "0",
        "form": "vtt",
        "draft_id": str(uuid.uuid4()),
    }
    signed = {"expires": "4102444800", "signature": "0" * 64}  # well formed, not signed by anyone
    tried = 0
    with httpx.Client(base_url=gateway.base_url, timeout=10) as anonymous:
        for path, operations in document["paths"].items():
            for method in operations:
                url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
                answer = anonymous.request(method.upper(), url, params=signed)
                expected = 200 if path in PROBES else 401
                assert answer.status_code == expected, (method, path, answer.status_code, answer.text)
                tried += 1
        for path in CONSOLE:
            assert anonymous.get(path).status_code == 200, path
    assert tried >= 18
    assert not [path for path in document["paths"] if path.startswith("/ui")]
