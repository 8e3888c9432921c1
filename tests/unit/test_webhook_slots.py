"""The receiving host a notice's places are counted by, and the places themselves.

Every spelling of one host is one key, read by a URL parser: case, a trailing dot, the scheme's port written or
not, userinfo, IPv6 brackets and their forms, IDNA.
"""

from __future__ import annotations

import pytest
from castad_api import webhook_slots


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://hooks.example.com/castad", "hooks.example.com:443"),
        ("https://HOOKS.Example.COM/castad", "hooks.example.com:443"),
        ("HTTPS://hooks.example.com/castad", "hooks.example.com:443"),
        ("https://hooks.example.com./castad", "hooks.example.com:443"),
        ("https://hooks.example.com:443/castad", "hooks.example.com:443"),
        ("https://hooks.example.com:0443/castad", "hooks.example.com:443"),
        ("https://user:secret@hooks.example.com/castad", "hooks.example.com:443"),
        ("https://user@HOOKS.example.com.:443/castad", "hooks.example.com:443"),
        ("https://hooks.example.com?a=1", "hooks.example.com:443"),
        ("https://hooks.example.com#part", "hooks.example.com:443"),
        ("https://hooks.example.com/a:b@c", "hooks.example.com:443"),
        ("http://hooks.example.com/castad", "hooks.example.com:80"),
        ("http://hooks.example.com:80/castad", "hooks.example.com:80"),
        ("http://hooks.example.com:8080/castad", "hooks.example.com:8080"),
        ("https://bücher.example/castad", "xn--bcher-kva.example:443"),
        ("https://BÜCHER.example./castad", "xn--bcher-kva.example:443"),
        ("https://xn--bcher-kva.example/castad", "xn--bcher-kva.example:443"),
        ("https://93.184.216.34/castad", "93.184.216.34:443"),
        ("https://93.184.216.34.:443/castad", "93.184.216.34:443"),
        ("https://[2001:db8::1]/castad", "[2001:db8::1]:443"),
        ("https://[2001:DB8::1]:443/castad", "[2001:db8::1]:443"),
        ("https://[2001:db8:0:0:0:0:0:1]/castad", "[2001:db8::1]:443"),
        ("http://[2001:db8::1]:8080/castad", "[2001:db8::1]:8080"),
    ],
)
def test_the_host_of_a_url_is_one_key_however_it_is_spelled(url: str, key: str) -> None:
    assert webhook_slots.host(url) == key


def test_other_hosts_and_other_ports_are_other_keys() -> None:
    keys = {
        webhook_slots.host(url)
        for url in (
            "https://hooks.example.com/",
            "https://hooks.example.com:8443/",
            "http://hooks.example.com/",
            "https://example.com/",
            "https://hooks.example.com.evil.test/",
            "https://[2001:db8::2]/",
        )
    }
    assert len(keys) == 6


@pytest.mark.parametrize("url", ["", "not a url", "https:///castad", "https://[::1/castad"])
def test_a_url_without_a_readable_host_has_the_empty_key(url: str) -> None:
    assert webhook_slots.host(url) == ""


def test_a_host_takes_at_most_its_share_and_all_hosts_at_most_the_total() -> None:
    slots = webhook_slots.Slots(total=3, per_host=2)

    assert slots.take("a:443") and slots.take("a:443")
    assert not slots.take("a:443")
    assert slots.full_hosts() == ["a:443"]
    assert slots.take("b:443")
    assert not slots.take("c:443") and slots.free() == 0
    slots.give_back("a:443")
    assert slots.full_hosts() == [] and slots.take("c:443") and slots.in_flight() == 3
