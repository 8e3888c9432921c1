"""What a tenant is told of an error: its code, and the code's meaning (castad_contracts.codes).

An attempt's own message is written for operators: it may name a file, a host, a provider's answer or
an exception. A tenant's key is shown the code (a stable word, documented with its meaning) and that
meaning instead; an admin key sees the message as the stage wrote it (disclosure.py).
"""

from __future__ import annotations

from castad_contracts import codes

UNKNOWN = "the stage failed"  # a code this version does not know (a newer stage's)


def message(code: str | None) -> str | None:
    """Return the public message of an error code (None without one)."""
    if code is None:
        return None
    known = codes.ErrorCode.known(code)
    return UNKNOWN if known is None else known.meaning
