"""Each service imports and starts from its own locked dependencies alone.

For every deployable package, a virtual environment synced from uv.lock holds what
`uv sync --package` would put there: that package (installed as a wheel, as an image would
hold it) and only what it depends on. A dependency a service imports but does not declare
fails here; one that another service needs but this one should not ship (numpy in the
gateway) fails the distribution check. The workspace wheels are built once per session.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import tomllib

import httpx
import pytest
from castad_local import REPO_ROOT, stack

from tests.support.installation import Installation

pytestmark = pytest.mark.integration

ENVS = REPO_ROOT / "var" / "envs"
WORKSPACE = ("castad", "castad-api", "castad-contracts", "castad-lyric", "castad-relay", "castad-runtime")
WORKSPACE += ("castad-song", "castad-video", "castad-local")
MEDIA = {"numpy", "pillow", "imageio-ffmpeg"}


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    module: str
    castad: set[str]  # the workspace distributions its environment holds
    absent: set[str] = dataclasses.field(default_factory=set)  # third-party ones it must not hold
    migrates: bool = True
    serves: tuple[str, ...] = ()  # paths that must answer 200 from the installed wheel (its package data)


SERVICES = (
    Package(
        "castad-api",
        "castad_api",
        {"castad-api", "castad-runtime", "castad-contracts"},
        MEDIA - {"pillow"},  # it decodes uploaded images (castad_runtime.images), but renders nothing
        serves=("/ui/", "/ui/console.css", "/ui/js/main.js"),  # the console's files, shipped in the wheel
    ),
    Package("castad-relay", "castad_relay", {"castad-relay", "castad-runtime", "castad-contracts"}, MEDIA, False),
    Package("castad-lyric", "castad_lyric", {"castad-lyric", "castad-runtime", "castad-contracts"}, MEDIA),
    Package("castad-song", "castad_song", {"castad-song", "castad-runtime", "castad-contracts"}, {"pillow"}),
    Package("castad-video", "castad_video", {"castad-video", "castad-runtime", "castad-contracts"}),
)
CLIENT = Package("castad", "castad_cli", {"castad", "castad-contracts"}, MEDIA | {"sqlalchemy", "dramatiq", "fastapi"})


def uv() -> pathlib.Path:
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["uv"]["required-version"]
    return REPO_ROOT / "var" / "tools" / f"uv-{version.removeprefix('==')}" / "bin" / "uv"


def run_uv(*args: str, project_environment: pathlib.Path | None = None) -> str:
    """Run the pinned uv in the repository, outside the test's own virtual environment."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    if project_environment:
        env["UV_PROJECT_ENVIRONMENT"] = str(project_environment)
    result = subprocess.run([str(uv()), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """Build every workspace package's wheel once per test session, by distribution name."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by this run's workers alone; a lone session's parent outlives it
    built = root / "wheels"
    with (root / "wheels.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            # Renamed only once complete, so a failed build is retried rather than half-used.
            building = root / "wheels.partial"
            run_uv("build", "--all-packages", "--wheel", "--clear", "--python", sys.executable, "-o", str(building))
            building.rename(built)
    return {wheel.name.split("-")[0].replace("_", "-"): wheel for wheel in built.glob("*.whl")}


def environment(package: Package, wheels: dict[str, pathlib.Path]) -> pathlib.Path:
    """Sync the package's own environment from the lock, its workspace members from the session's wheels."""
    target = ENVS / package.name
    locked = ["--frozen", "--no-dev", "--no-editable", "--package", package.name]
    run_uv("sync", *locked, "--no-install-workspace", "--python", sys.executable, "--quiet", project_environment=target)
    # The lock, not `package.castad`, decides which members to install, so an undeclared one stays missing.
    exported = tomllib.loads(run_uv("export", *locked, "--format", "pylock.toml", "--quiet"))
    members = [str(wheels[entry["name"]]) for entry in exported["packages"] if "directory" in entry]
    python = target / "bin" / "python"
    run_uv("pip", "install", "--no-deps", "--python", str(python), "--quiet", *members)
    return python


def distributions(python: pathlib.Path) -> set[str]:
    listing = subprocess.run(
        [python, "-c", "import importlib.metadata as m, json; print(json.dumps([d.name for d in m.distributions()]))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {name.lower().replace("_", "-") for name in json.loads(listing.stdout)}


IMPORT_ALL = """
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
assert package.__file__ and "site-packages" in package.__file__, package.__file__
for module in pkgutil.walk_packages(package.__path__, sys.argv[1] + "."):
    if ".migrations" not in module.name and not module.name.endswith("__main__"):
        importlib.import_module(module.name)
"""


def check_installed(package: Package, wheels: dict[str, pathlib.Path]) -> pathlib.Path:
    python = environment(package, wheels)
    installed = distributions(python)
    assert {name for name in installed if name in WORKSPACE} == package.castad
    assert installed & package.absent == set()
    # Every module imports from the installed wheel, not from the checkout.
    result = subprocess.run(
        [python, "-c", IMPORT_ALL, package.module], cwd="/", capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return python


@pytest.mark.timeout(900)
@pytest.mark.parametrize("package", SERVICES, ids=lambda p: p.name)
def test_a_service_starts_from_its_own_environment(
    package: Package, wheels: dict[str, pathlib.Path], installation: Installation, tmp_path
):
    python = check_installed(package, wheels)
    service = package.name.removeprefix("castad-")
    port = stack.free_port()
    # The gateway serves its probes on its API port unless told otherwise: one port, probed.
    probes = "CASTAD_API_PORT" if service == "api" else f"CASTAD_{service.upper()}_HEALTH_PORT"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CASTAD_", "VIRTUAL_ENV", "PYTHONPATH"))},
        **installation.env(),
        "OTEL_TRACES_EXPORTER": "none",
        probes: str(port),
    }
    if package.migrates:
        command = [python, "-m", package.module, "migrate"]
        migrated = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert migrated.returncode == 0, migrated.stderr

    log = tmp_path / f"{service}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [python, "-m", package.module, "run"], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        answer = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert answer is not None and answer.status_code == 200, log.read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        for path in package.serves:
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code == 200, path
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, log.read_text()


@pytest.mark.timeout(600)
def test_the_client_cli_runs_with_the_contracts_alone(wheels: dict[str, pathlib.Path]):
    python = check_installed(CLIENT, wheels)
    castad = python.parent / "castad"
    shown = subprocess.run([castad, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "submit" in shown.stdout
    unreachable = subprocess.run(
        [castad, "--gateway", "http://127.0.0.1:1", "status", "00000000-0000-0000-0000-000000000000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 3, unreachable.stderr
    assert "Traceback" not in unreachable.stderr
