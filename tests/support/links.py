"""The tests' link secret, each signing stage's key derived from it, and the links signed with them."""

from __future__ import annotations

import urllib.parse

from castad_runtime import links
from pydantic import SecretStr

LINK_SECRET = "castad-tests-link-secret-0123456789abcdef"  # CASTAD_API_LINK_SECRET of the tests


def link_secrets() -> dict[str, str]:
    """The gateway's root link secret and each signing stage's key derived from it, as their variables."""
    return {"CASTAD_API_LINK_SECRET": LINK_SECRET, **links.stage_keys(SecretStr(LINK_SECRET))}


def stage_link_secret(stage: str) -> SecretStr:
    """A signing stage's key, derived from LINK_SECRET as `python -m castad_api link-secrets` derives it."""
    return links.stage_secret(SecretStr(LINK_SECRET), stage)


def signed_path(url: str, base_url: str) -> str:
    """The path of a link a stage signed (castad_runtime.links) as the gateway takes it; fails unless valid."""
    assert url.startswith(base_url), url
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    expires, signature = int(query["expires"][0]), query["signature"][0]
    assert links.accepted(SecretStr(LINK_SECRET), parsed.path, expires, signature, max_s=6 * 3600), url
    return parsed.path
