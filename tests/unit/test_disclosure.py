"""What a tenant's key is shown of internals, on a keyring of the tests' own.

Workers named opaquely (the same worker alike within a pipeline, unrelated across pipelines), public error
messages, dead letters bare, and stream cursors that open only for their tenant.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from castad_api import disclosure, public_errors
from castad_contracts import codes
from fastapi.exceptions import RequestValidationError


class Keys:
    """A keyring whose root is fixed (the gateway's own lives in its database)."""

    def key(self, use: str) -> bytes:
        return hmac.new(b"tests' root", use.encode(), hashlib.sha256).digest()


def viewer(tenant: str) -> disclosure.Viewer:
    return disclosure.Viewer(tenant, Keys())  # type: ignore[arg-type]


def test_a_worker_is_named_the_same_within_a_pipeline_and_unrelated_across_pipelines():
    alice = viewer("alice")
    first, again = alice.worker("p1", "lyric@host-a:1"), alice.worker("p1", "lyric@host-a:1")
    other_worker, other_pipeline = alice.worker("p1", "lyric@host-b:1"), alice.worker("p2", "lyric@host-a:1")

    assert first == again and first is not None and first.startswith("w-") and "host" not in first
    assert len({first, other_worker, other_pipeline}) == 3
    assert disclosure.INTERNAL.worker("p1", "lyric@host-a:1") == "lyric@host-a:1"


def test_an_entry_shows_a_tenant_codes_with_public_messages_and_dead_letters_bare():
    alice = viewer("alice")
    retrying = {"status": "retrying", "worker": "w@h:1", "error": {"code": "provider_auth", "message": "key sk-1 bad"}}
    letter = {"status": "dead_letter_recorded", "reason": "Traceback ...", "dead_letter": 7}
    own = {"status": "cancel_requested", "actor": "ops", "actor_key": {"id": "k1", "name": "mine", "tenant": "alice"}}
    theirs = {**own, "actor_key": {"id": "k2", "name": "ops console", "tenant": "platform"}}

    assert alice.entry("p", retrying)["error"] == {
        "code": "provider_auth",
        "message": codes.ErrorCode.PROVIDER_AUTH.meaning,
    }
    assert alice.entry("p", letter) == {"status": "dead_letter_recorded"}
    assert (alice.entry("p", own)["actor_key_id"], alice.entry("p", own)["actor_key_name"]) == ("k1", "mine")
    assert "actor_key_id" not in alice.entry("p", theirs) and alice.entry("p", theirs)["actor"] == "ops"
    assert disclosure.INTERNAL.entry("p", letter) == letter
    assert disclosure.INTERNAL.entry("p", theirs)["actor_key_name"] == "ops console"
    assert public_errors.message("something new") == public_errors.UNKNOWN and public_errors.message(None) is None


def test_a_tenants_cursor_resumes_its_own_stream_and_nobody_elses():
    alice, bob = viewer("alice"), viewer("bob")
    cursor = alice.cursor(123_456)

    assert len(cursor) == disclosure.CURSOR_CHARS and "123456" not in cursor
    assert alice.resumes_after(cursor) == 123_456 and alice.resumes_after(None) is None
    assert alice.cursor(123_457) != cursor
    tampered = cursor[:5] + ("A" if cursor[5] != "A" else "B") + cursor[6:]  # six whole bits of it changed
    for made_up in (tampered, "123456", cursor + "x", "ü" * 22):
        with pytest.raises(RequestValidationError):
            alice.resumes_after(made_up)
    with pytest.raises(RequestValidationError):
        bob.resumes_after(cursor)
    assert disclosure.INTERNAL.cursor(42) == "42" and disclosure.INTERNAL.resumes_after("42") == 42
