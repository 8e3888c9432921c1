"""An earlier release of Castad, installed from git beside the working tree, to run next to this one.

Its source is a git worktree of the commit (var/upgrade/<commit>), its environment that worktree's own .venv synced
from its own uv.lock (the dependencies come from uv's cache, so a second install takes seconds); its processes run
that environment's Python, which imports that release's packages.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

from castad_local import REPO_ROOT

# The last commit of 0.2.0, the release before releases were tagged (CHANGELOG.md): where an upgrade starts when no
# tag does.
RELEASE_0_2_0 = "0b8a9212659e8f9f7fc85f47ecad7e1eaa19f840"
PLACE = REPO_ROOT / "var" / "upgrade"


@dataclasses.dataclass(frozen=True)
class Release:
    name: str  # how the report names it: a tag, or a short commit
    commit: str
    python: pathlib.Path  # its environment's interpreter


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def previous() -> str:
    """The newest release tag behind HEAD, or 0.2.0's commit when no release was tagged yet."""
    tags = _git("tag", "--merged", "HEAD~1", "--list", "v*", "--sort=-version:refname").split()
    return tags[0] if tags else RELEASE_0_2_0


def install(ref: str) -> Release:
    """The release at `ref` (a tag, a branch, a commit), installed once and kept under var/upgrade."""
    try:
        commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    except RuntimeError as error:
        raise RuntimeError(
            f"{ref} is not in this clone's history ({error}); an upgrade test needs it (fetch it, or a full clone)"
        ) from None
    tree = PLACE / commit[:12]
    if not (tree / ".git").exists():
        PLACE.mkdir(parents=True, exist_ok=True)
        _git("worktree", "prune")
        _git("worktree", "add", "--detach", "--force", str(tree), commit)
    uv = _uv()
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(
        [
            str(uv),
            "sync",
            "--frozen",
            "--all-packages",
            "--no-dev",
            "--python",
            sys.executable,
            "--quiet",
            "--compile-bytecode",
        ],
        cwd=tree,
        env=env,
        check=True,
        timeout=600,
    )
    name = ref if ref.startswith("v") else commit[:8]
    return Release(name, commit, tree / ".venv" / "bin" / "python")


def this() -> Release:
    """The working tree's own release (HEAD and what is not committed yet)."""
    return Release("HEAD", _git("rev-parse", "HEAD"), pathlib.Path(sys.executable))


def _uv() -> pathlib.Path:
    """The uv that set this tree up (the version pyproject.toml requires), in var/tools."""
    found = sorted((REPO_ROOT / "var" / "tools").glob("uv-*/bin/uv"))
    if not found:
        raise RuntimeError("no uv in var/tools: run make setup")
    return found[-1]
