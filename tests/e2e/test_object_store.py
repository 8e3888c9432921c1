"""Artifacts in an S3-compatible bucket (moto's server mode), every service its own process.

Each stage uploads its artifact, the video stage reads the song from the bucket, and the gateway's download
redirects to a presigned URL that serves the exact bytes.
"""

from __future__ import annotations

import hashlib
import re

import httpx
import pytest
from castad_contracts import topology
from castad_testkit import briefs

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_pipeline_keeps_every_artifact_in_the_bucket_and_the_gateway_redirects_to_it(
    castad, installation, object_store, bucket
):
    running = castad(object_store.env(bucket))

    pipeline_id = running.submit(briefs.sample("버킷책방"))
    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert view.status == "SUCCEEDED"
    listed = object_store.client().list_objects_v2(Bucket=bucket)["Contents"]
    keys = sorted(item["Key"] for item in listed)  # each in its stage's own place
    named = sorted(f"{s}/{pipeline_id}/{s}" for s in (*topology.STAGES, "video"))  # every stage's file, the poster
    assert [re.sub(r"(-[0-9a-f]{16})+\.\w+$", "", key) for key in keys] == named  # less the digests in each name
    for stage in view.stages:
        assert stage.artifact is not None  # by its gateway path, never by its bucket key
        assert stage.artifact.download == f"/v1/pipelines/{pipeline_id}/artifacts/{stage.stage.value}"
        answer = running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/{stage.stage.value}")
        assert answer.status_code == 307
        content = httpx.get(answer.headers["location"]).content
        assert hashlib.sha256(content).hexdigest() == stage.artifact.sha256
    # Only scratch space on local disk: no artifact file stays there.
    assert not [p for p in installation.artifacts_dir.rglob("*") if p.is_file()]
