"""The readings of Japanese text (each word and its kana), by Janome in a process of its own.

Janome's dictionary takes about 4 s to load and 650 MB to hold: in the service's own process, every song replica
that ever sang a Japanese line would keep it for good. A child process loads it for the first Japanese line, answers
every line after it, and exits once it has had nothing to read for IDLE_S, giving the memory back.

Run as `python -m castad_song.reading`: a line of JSON text in, a line of JSON `[[surface, phonetic], ...]` out,
until its input ends (its parent stopped, or closed it).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading

log = logging.getLogger(__name__)

IDLE_S = 120.0  # the child exits after this long without a line to read
READ_S = 60.0  # the longest wait for a line's reading, the dictionary's first load included


class ReadingFailed(RuntimeError):
    """The reading process could not be started or did not answer."""


class Reader:
    """The parent's side: one child at a time, started on demand, stopped after IDLE_S without a line."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._child: subprocess.Popen[str] | None = None
        self._idle: threading.Timer | None = None

    def read(self, text: str) -> list[tuple[str, str]]:
        """Each word of `text` and its phonetic reading in katakana ("*" where the dictionary has none)."""
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
            try:
                return self._ask(text)
            except (OSError, ValueError, ReadingFailed):  # a child that died: a new one, once
                self._stop()
                return self._ask(text)
            finally:
                self._idle = threading.Timer(self._idle_s, self.stop)
                self._idle.daemon = True
                self._idle.start()

    def stop(self) -> None:
        """End the child, if one runs (it gives its memory back)."""
        with self._lock:
            self._stop()

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def _ask(self, text: str) -> list[tuple[str, str]]:
        child = self._started()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(text, ensure_ascii=False) + "\n")
        child.stdin.flush()
        answered = _readline(child, READ_S)
        if not answered:
            raise ReadingFailed(f"the reading process ended (exit status {child.poll()})")
        return [(str(surface), str(phonetic)) for surface, phonetic in json.loads(answered)]

    def _started(self) -> subprocess.Popen[str]:
        if self._child is not None and self._child.poll() is not None:  # it ended: its pipes closed, then anew
            self._stop()
        if self._child is None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                encoding="utf-8",
            )
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        try:
            child.communicate(timeout=5)  # its input closed: its loop ends
        except (OSError, ValueError, subprocess.TimeoutExpired):
            child.kill()
            child.communicate()


def _readline(child: subprocess.Popen[str], timeout_s: float) -> str:
    """The child's next line of output; ReadingFailed (the child killed) if none comes within `timeout_s`."""
    stdout = child.stdout
    assert stdout is not None
    got: list[str] = []
    reading = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
    reading.start()
    reading.join(timeout_s)
    if reading.is_alive():
        child.kill()
        raise ReadingFailed(f"the reading process did not answer in {timeout_s:g} s")
    return got[0]


def main() -> int:
    from janome import tokenizer

    words = tokenizer.Tokenizer()
    for line in sys.stdin:
        tokens = words.tokenize(json.loads(line))
        read = [[str(t.surface), str(t.phonetic)] for t in tokens if not isinstance(t, str)]
        sys.stdout.write(json.dumps(read, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
