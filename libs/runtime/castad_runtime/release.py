"""Which release of Castad runs.

One number for every package, chart and image, set in one place (`[tool.bumpversion]` of the workspace's
pyproject.toml, which `make release` bumps everywhere and tags); CHANGELOG.md says what each release changed and in
which order to roll services out. Each service tells its own: in `/healthz`, its traces' `service.version`, and
`castad-admin version`.
"""

from __future__ import annotations

import importlib.metadata

UNKNOWN = "unknown"


def of(service: str) -> str:
    """The release of `service` (api, relay, lyric, song, video) as installed here."""
    try:
        return importlib.metadata.version(f"castad-{service}")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def installed() -> dict[str, str]:
    """Every Castad package installed here (the `castad` command line and each castad-*), and its release."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "")
        if name == "castad" or name.startswith("castad-"):
            found[name] = dist.version
    return dict(sorted(found.items()))
