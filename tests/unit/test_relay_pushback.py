"""The relay's push-back: a destination that refuses publishes is probed by one row at a time, less and less often."""

from __future__ import annotations

import pytest
from castad_relay import pushback


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rows_for_a_refusing_destination_wait_while_one_probes_at_doubling_pauses_until_it_is_taken():
    clock = Clock()
    back = pushback.PushBack(first_s=1.0, max_s=4.0, clock=clock, seed=1)
    assert back.hold("song.completed") is None  # nothing refused yet: sent

    first = back.refused("song.completed")
    assert first.sent and 0.8 <= first.wait_s <= 1.0
    beside = back.refused("song.completed")  # a publish sent beside it, refused in the same round
    assert beside.sent and beside.wait_s == pytest.approx(first.wait_s, abs=0.05)
    held = back.hold("song.completed")
    assert held is not None and not held.sent and held.wait_s >= first.wait_s  # a first_s at least
    assert back.hold("video.completed") is None  # other destinations go on

    clock.now += first.wait_s
    assert back.hold("song.completed") is None  # the probe
    assert back.hold("song.completed") == pushback.PushedBack("song.completed", 1.0)  # the others wait meanwhile
    pauses = [first.wait_s]
    for _ in range(4):
        refused = back.refused("song.completed")
        pauses.append(refused.wait_s)
        clock.now += refused.wait_s
        assert back.hold("song.completed") is None
    assert 1.6 <= pauses[1] <= 2.0 and all(3.2 <= pause <= 4.0 for pause in pauses[2:])  # doubled, up to max_s

    back.taken("song.completed")
    assert back.hold("song.completed") is None and back.hold("song.completed") is None  # all go again


def test_a_probe_lost_to_other_trouble_lets_another_row_probe():
    clock = Clock()
    back = pushback.PushBack(first_s=1.0, clock=clock, seed=1)
    clock.now += back.refused("lyric.completed").wait_s
    assert back.hold("lyric.completed") is None  # the probe, lost on the way
    assert back.hold("lyric.completed") is not None
    back.lost("lyric.completed")
    assert back.hold("lyric.completed") is None  # the next probe
