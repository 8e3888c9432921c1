"""What may leave a process in a log line, a span, a dead letter's reason or an error message.

Credentials are masked wherever they appear (`scheme://user:password@host`, libpq's
`password=...`, `Bearer <token>`, keys shaped like `sk-...`, `whsec_...` or Castad's own `cad_...`,
the value of a query parameter that carries one, in any case and URL-encoded too: a link's
`signature`, a presigned URL's `X-Amz-Signature`, `X-Amz-Credential` and `X-Amz-Security-Token`,
`token`, `key`, ...), and so is every secret the process was given (`known`: a provider's key
has no shape of its own); an error is described by its class and the first line of its
message, never by its repr, which for a database error carries the SQL and its parameters (a
brief's text, for instance). Logs (castad_runtime.logs) and spans (castad_runtime.telemetry)
both pass through `mask`.
"""

from __future__ import annotations

import re
import threading

import pydantic
import sqlalchemy as sa

MASK = "***"
DESCRIPTION_MAX = 300
KNOWN_MIN_CHARS = 8  # a shorter "secret" would mask ordinary words
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*):(?P<secret>[^\s@/]*)@")
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\b(?:password|passwd|pwd)\s*=\s*)(?P<secret>'[^']*'|\S+)", re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<secret>[^\s,;]+)", re.IGNORECASE)
_API_KEY = re.compile(r"\bsk-[A-Za-z0-9_*-]{4,}|\bwhsec_[A-Za-z0-9+/=]{4,}|\bcad_[A-Za-z0-9_-]{20,}")
# A query parameter holding a credential, after `?`, `&` or `;`, plain or URL-encoded (a URL inside another's query).
_SECRET_PARAMETERS = (
    "signature|sig|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential"
    "|awsaccesskeyid|token|access_token|id_token|refresh_token|api_key|apikey|key|client_secret|secret|password"
)
_QUERY_SECRET = re.compile(
    rf"(?P<head>(?:[?&;]|%3f|%26|%3b)(?:{_SECRET_PARAMETERS})(?:=|%3d))(?P<secret>[^&;#\s\"'<>%]+(?:%(?!26|3b|23)[^&;#\s\"'<>%]*)*)",
    re.IGNORECASE,
)
_QUERY_WORDS = ("sig", "token", "key", "secret", "credential", "password")
_known: frozenset[str] = frozenset()
_known_lock = threading.Lock()


def known(*secrets: str) -> None:
    """Mask these values wherever they appear from now on (a provider's key, a link secret)."""
    global _known
    fresh = {secret for secret in secrets if len(secret) >= KNOWN_MIN_CHARS} - _known
    if not fresh:  # the usual case: a key read again
        return
    with _known_lock:
        _known = _known | {secret for secret in secrets if len(secret) >= KNOWN_MIN_CHARS}


def mask(text: str) -> str:
    """`text` with every password, token, key, signature and known secret replaced by ***.

    Passwords in a URL or a libpq connection string, bearer tokens and API keys are all masked.

    Every log line and span attribute passes here, and most hold no credential: a pattern runs only on a
    text holding the words it needs (a substring test costs far less than a regular expression's scan)."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    folded = text.casefold()  # as the patterns' IGNORECASE compares (ſ is s, K is k)
    if "://" in text and "@" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    if "pass" in folded or "pwd" in folded:
        text = _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
    if "bearer" in folded:
        text = _BEARER.sub(lambda m: f"{m['head']}{MASK}", text)
    if "sk-" in text or "whsec_" in text or "cad_" in text:
        text = _API_KEY.sub(MASK, text)
    if ("=" in text or "%3d" in folded) and any(word in folded for word in _QUERY_WORDS):
        text = _QUERY_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)
    return text


def describe(error: BaseException) -> str:
    """`ClassName: first line of the message`, masked and short.

    For a SQLAlchemy error, the driver's error it wraps: its message without the statement and the parameters.
    """
    if isinstance(error, sa.exc.StatementError) and error.orig is not None:
        error = error.orig
    lines = str(error).strip().splitlines()
    first = lines[0] if lines else ""
    text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    text = mask(text)
    return text if len(text) <= DESCRIPTION_MAX else text[: DESCRIPTION_MAX - 1] + "…"


def validation_summary(error: pydantic.ValidationError, limit: int = 5) -> str:
    """Where and why input was refused (`field.path: message; ...`), without the input itself."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:limit])
