"""The limit of failed authentications per client address and the memory of unknown keys.

The limit is a token bucket; both run on a clock of the tests' own.
"""

from __future__ import annotations

import secrets

from castad_api import auth, keys


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_address_may_fail_its_burst_then_earns_a_try_back_at_its_rate():
    clock = Clock()
    limit = auth.FailureLimit(burst=2, per_s=0.5, clock=clock)

    assert limit.wait_s("10.0.0.1") is None
    limit.failed("10.0.0.1")
    limit.failed("10.0.0.1")
    assert limit.wait_s("10.0.0.1") == 2.0  # one token at 0.5 a second
    assert limit.wait_s("10.0.0.2") is None  # another address has a bucket of its own
    clock.now += 1.5
    assert limit.wait_s("10.0.0.1") == 0.5
    clock.now += 0.5
    assert limit.wait_s("10.0.0.1") is None


def test_an_ipv6_host_fails_from_its_whole_64_and_a_mapped_ipv4_address_is_that_address():
    """One host holds a /64 and may take a new address of it for every try: the /64 is the client."""
    limit = auth.FailureLimit(burst=1, per_s=0.01, clock=Clock())

    limit.failed("2001:db8:0:7::1")
    assert limit.wait_s("2001:db8:0:7:abcd::99") is not None
    assert limit.wait_s("2001:db8:0:8::1") is None  # the next /64: another client
    limit.failed("::ffff:10.0.0.9")
    assert limit.wait_s("10.0.0.9") is not None
    assert [auth.client_of(a) for a in ("2001:db8:0:7::1", "::ffff:10.0.0.9", "10.0.0.9", "testclient")] == [
        "2001:db8:0:7::/64",
        "10.0.0.9",
        "10.0.0.9",
        "testclient",
    ]


def test_a_bucket_never_holds_more_than_its_burst():
    clock = Clock()
    limit = auth.FailureLimit(burst=1, per_s=1.0, clock=clock)
    limit.failed("a")
    clock.now += 3600
    limit.failed("a")
    assert limit.wait_s("a") == 1.0


def test_a_key_digest_is_remembered_for_its_time_only():
    clock = Clock()
    unknown = auth.Remembered(ttl_s=60, clock=clock)
    unknown.add("digest")
    assert "digest" in unknown and "other" not in unknown
    clock.now += 61
    assert "digest" not in unknown


def test_only_a_key_of_the_form_the_gateway_makes_is_well_formed():
    assert keys.well_formed(keys.PREFIX + secrets.token_urlsafe(30))
    for token in ("", "cad_", "cad_" + "a" * 39, "cad_" + "a" * 41, "xyz_" + "a" * 40, "cad_" + "é" * 40):
        assert not keys.well_formed(token), token
