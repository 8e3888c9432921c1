"""API keys of a local Castad: the key `make setup` leaves for the `castad` command line in
~/.config/castad/api-key, and keys for tests and benchmarks of an installation (its variables in
`env`). `castad-admin keys ...` is the gateway's own `keys` command (castad_api.commands.keys).
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Mapping

from castad_api import keys
from castad_api.commands import keys as key_commands
from castad_api.settings import ApiSettings

LOCAL_KEY_FILE = pathlib.Path.home() / ".config" / "castad" / "api-key"
LOCAL_TENANT = "local"


def gateway_settings(env: Mapping[str, str] | None = None) -> ApiSettings:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        return ApiSettings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def create_key(tenant: str, scopes: frozenset[keys.Scope], name: str, env: Mapping[str, str] | None = None) -> str:
    return key_commands.create_key(gateway_settings(env), tenant, scopes, name)


def revoke_key(key_id: uuid.UUID, env: Mapping[str, str] | None = None) -> bool:
    return key_commands.revoke_key(gateway_settings(env), key_id)


def ensure_local_key(path: pathlib.Path = LOCAL_KEY_FILE) -> tuple[str, bool]:
    """The key in `path` if this gateway knows it, else a new admin key of the tenant `local` written
    there (readable by its owner only). Returns the key and whether it is new."""
    existing = path.read_text(encoding="utf-8").strip() if path.exists() else ""
    with key_commands.gateway_db(gateway_settings()) as conn:
        if existing and keys.authenticate(conn, existing) is not None:
            return existing, False
        made = keys.create(conn, LOCAL_TENANT, frozenset(keys.Scope), "local: made by castad-admin setup")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(made.key + "\n", encoding="utf-8")
    return made.key, True
