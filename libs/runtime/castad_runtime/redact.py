"""What may leave a process in a log line, a dead letter's reason or an error message.

Credentials are masked wherever they appear (`scheme://user:password@host`, libpq's
`password=...`, `Bearer <token>`, keys shaped like `sk-...` or `whsec_...`); an error is described by
its class and the first line of its message, never by its repr, which for a database error
carries the SQL and its parameters (a brief's text, for instance).
"""

from __future__ import annotations

import re

import pydantic
import sqlalchemy as sa

MASK = "***"
DESCRIPTION_MAX = 300
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*):(?P<secret>[^\s@/]*)@")
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\b(?:password|passwd|pwd)\s*=\s*)(?P<secret>'[^']*'|\S+)", re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<secret>[^\s,;]+)", re.IGNORECASE)
_API_KEY = re.compile(r"\bsk-[A-Za-z0-9_*-]{4,}|\bwhsec_[A-Za-z0-9+/=]{4,}")


def mask(text: str) -> str:
    """`text` with every password (in a URL or a libpq connection string), bearer token and API key replaced by ***.

    Every log line passes here, and most hold no credential: a pattern runs only on a text holding the
    words it needs (a substring test costs far less than a regular expression's scan)."""
    folded = text.casefold()  # as the patterns' IGNORECASE compares (ſ is s, K is k)
    if "://" in text and "@" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    if "pass" in folded or "pwd" in folded:
        text = _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
    if "bearer" in folded:
        text = _BEARER.sub(lambda m: f"{m['head']}{MASK}", text)
    if "sk-" in text or "whsec_" in text:
        text = _API_KEY.sub(MASK, text)
    return text


def describe(error: BaseException) -> str:
    """`ClassName: first line of the message`, masked and short. For a SQLAlchemy error, the
    driver's error it wraps: its message without the statement and the parameters."""
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
