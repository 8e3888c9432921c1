"""Links of the gateway that a network provider may use without an API key, signed by a stage.

A provider cannot send Castad's API key: the song it must fetch (a render API) and the callback
it makes when its work moves on are links with an expiry and an HMAC-SHA256 signature under
CASTAD_LINK_SECRET, which the gateway and the stages share. The gateway checks both; a link
for another path, altered or expired, is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.parse

from pydantic import SecretStr


def signature(secret: SecretStr, path: str, expires: int) -> str:
    message = f"{path}\n{expires}".encode()
    return hmac.new(secret.get_secret_value().encode(), message, hashlib.sha256).hexdigest()


def sign(base_url: str, path: str, secret: SecretStr, valid_s: float) -> str:
    """`base_url` + `path` with its expiry and signature as query parameters."""
    expires = int(time.time() + valid_s)
    query = urllib.parse.urlencode({"expires": expires, "signature": signature(secret, path, expires)})
    return f"{base_url.rstrip('/')}{path}?{query}"


def valid(secret: SecretStr, path: str, expires: int, given: str) -> bool:
    return expires >= time.time() and hmac.compare_digest(signature(secret, path, expires), given)
