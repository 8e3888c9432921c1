"""The local stack: set up, start, stop and demo every Castad service on one machine."""

import pathlib

# The repository this tooling is part of (it only ever runs from a checkout).
REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
