"""Japanese readings by Janome in a process of its own: the song service never holds its dictionary itself."""

from __future__ import annotations

import os
import time

from castad_contracts import brief
from castad_song import g2p, reading

LINE = "群山の朝はやさしい"


def anonymous_memory_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        fields = dict(line.split(":", 1) for line in status.read().splitlines())
    return int(fields["RssAnon"].split()[0]) / 1024


def test_a_japanese_line_is_read_by_a_child_started_again_if_it_died_and_gone_when_idle():
    reader = reading.Reader(idle_s=1.0)
    before = anonymous_memory_mb()

    words = reader.read(LINE)

    assert [surface for surface, _ in words] == ["群", "山", "の", "朝", "は", "やさしい"]
    assert dict(words)["朝"] == "アサ" and dict(words)["やさしい"] == "ヤサシイ"
    assert anonymous_memory_mb() - before < 50  # the dictionary (about 650 MB) is the child's alone
    assert reader._child is not None
    reader._child.kill()  # died: a new one for the next line
    reader._child.wait()
    assert reader.read("朝") == [("朝", "アサ")]
    assert reader.running
    deadline = time.monotonic() + 10
    while reader.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not reader.running  # idle: gone, its memory with it
    reader.stop()


def test_japanese_syllables_come_from_the_readings_one_mora_each():
    sung = g2p.syllables("朝はやさしい", brief.Language.JAPANESE)

    assert [s.sound for s in sung] == ["ア", "サ", "ワ", "ヤ", "サ", "シ", "イ"]  # the particle は sung as ワ
    assert [(s.text, s.at) for s in sung][:3] == [("朝", 0), ("", 1), ("は", 1)]  # a kanji sung over two morae
