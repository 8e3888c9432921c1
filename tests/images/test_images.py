"""Every service's image builds on this machine, and the whole stack runs from the images.

It runs to a finished video against the local PostgreSQL and RabbitMQ (`make images`; not part of `make test`).

Containers run as the images define them (non-root, SIGTERM, tini), with a read-only root
filesystem as the Helm charts run them, on the host's network to reach the servers, sharing
one artifacts directory as the charts share one volume.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator

import httpx
import pytest
from castad_cli import client as client_
from castad_contracts import api, topology
from castad_local import REPO_ROOT, stack
from castad_testkit import briefs

from tests.support.installation import Installation

pytestmark = [pytest.mark.images, pytest.mark.integration]

ARTIFACTS = "/var/lib/castad/artifacts"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(REPO_ROOT / "infra" / "images" / "containers.conf")}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}: {result.stderr}"
    return result


def version(service: str) -> str:
    return tomllib.loads((REPO_ROOT / "services" / service / "pyproject.toml").read_text())["project"]["version"]


def image(service: str) -> str:
    return f"localhost/castad/{service}:{version(service)}"


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Every image, built now (the root filesystem is made once and kept)."""
    if shutil.which("podman") is None and os.geteuid() != 0:
        pytest.fail("podman is missing and only root can install it: run `make images` as root")
    built = subprocess.run(
        [str(REPO_ROOT / "infra" / "images" / "build.sh")], capture_output=True, text=True, timeout=3600
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return {service: image(service) for service in topology.SERVICES}


def test_each_image_is_slim_non_root_labelled_and_stops_on_sigterm(images):
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    for service, name in images.items():
        (config,) = json.loads(podman("image", "inspect", name).stdout)
        assert config["Config"]["User"] == "10001:10001"
        assert config["Config"]["StopSignal"] == "SIGTERM"
        assert config["Config"]["Entrypoint"][:2] == ["tini", "--"]
        labels = config["Config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == version(service)
        assert labels["org.opencontainers.image.title"] == f"castad-{service}"
        assert labels["org.opencontainers.image.revision"] == revision.strip()
        # Only the service's own dependencies; no pip, no compiler.
        probe = "import importlib.util as u, shutil; "
        probe += "print([m for m in ('numpy', 'PIL', 'pip') if u.find_spec(m)], shutil.which('gcc'))"
        found = podman("run", "--rm", "--read-only", "--entrypoint", "python", name, "-c", probe).stdout.strip()
        expected = {"song": "['numpy']", "video": "['numpy', 'PIL']"}.get(service, "[]")
        assert found == f"{expected} None", (service, found)


@pytest.fixture
def containers(images) -> Iterator[dict[str, str]]:
    run_id = uuid.uuid4().hex[:8]
    names = {service: f"castad-test-{run_id}-{service}" for service in topology.SERVICES}
    yield names
    for name in names.values():
        podman("rm", "--force", "--time", "0", name, check=False)


def run_container(
    name: str, service: str, command: str, env: dict[str, str], artifacts: pathlib.Path, *, detach: bool
) -> None:
    """`podman run` the service's image as the charts run it: read-only root, /tmp and the artifacts writable."""
    args = ["run", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp"]
    args += ["--volume", f"{artifacts}:{ARTIFACTS}", *(["--detach"] if detach else [])]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    podman(*args, image(service), command, timeout=300)


@pytest.mark.timeout(1800)
def test_the_stack_runs_from_the_images_to_a_finished_video(images, containers, installation: Installation, tmp_path):
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    os.chown(artifacts, 10001, 10001)  # the images' user
    ports = {service: stack.free_port() for service in topology.SERVICES}
    env = {
        **{k: v for k, v in installation.env().items() if k != "CASTAD_ARTIFACTS_DIR"},
        "OTEL_TRACES_EXPORTER": "none",
        "CASTAD_API_PORT": str(ports["api"]),
        **{f"CASTAD_{service.upper()}_HEALTH_PORT": str(ports[service]) for service in topology.WORKERS},
    }
    for service in topology.WITH_DATABASE:
        run_container(f"{containers[service]}-migrate", service, "migrate", env, artifacts, detach=False)
        podman("rm", f"{containers[service]}-migrate")
    for service in topology.SERVICES:
        run_container(containers[service], service, "run", env, artifacts, detach=True)

    deadline = time.monotonic() + 120
    waiting = set(topology.SERVICES)
    while waiting and time.monotonic() < deadline:
        for service in list(waiting):
            try:
                if httpx.get(f"http://127.0.0.1:{ports[service]}/readyz", timeout=3).status_code == 200:
                    waiting.discard(service)
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    assert not waiting, {
        service: podman("logs", containers[service], check=False).stderr[-2000:] for service in waiting
    }

    gateway = client_.Client(f"http://127.0.0.1:{ports['api']}", api_key=installation.api_key)
    try:
        accepted = gateway.submit(briefs.sample(), f"images-{uuid.uuid4()}")
        deadline = time.monotonic() + 600
        view = gateway.status(accepted.id)
        while view.status not in api.ENDED and time.monotonic() < deadline:
            time.sleep(1)
            view = gateway.status(accepted.id)
        assert view.status == "SUCCEEDED", (
            view,
            {s: podman("logs", c, check=False).stderr[-3000:] for s, c in containers.items()},
        )
        video = view.stages[-1].artifact
        assert video is not None
        fetched = tmp_path / "video.mp4"
        assert gateway.download(video.download, fetched) == video.size and fetched.read_bytes()[4:8] == b"ftyp"
    finally:
        gateway.close()

    # A stop is a clean stop: SIGTERM, drain, exit 0 (well within the charts' grace periods).
    for service, name in containers.items():
        podman("stop", "--time", "60", name, timeout=90)
        (state,) = json.loads(podman("inspect", name).stdout)
        assert state["State"]["ExitCode"] == 0, (service, podman("logs", name, check=False).stderr[-2000:])
