"""The instant lyric provider: one line at once, so benchmarks measure everything around the provider."""

from __future__ import annotations

from castad_contracts import brief, events
from castad_runtime.stage import cancellation


class InstantLyricProvider:
    """Lyrics of a single verse line naming the business and its region, without any work."""

    def write(
        self,
        brief: brief.Brief,
        seed: str,
        cancel: cancellation.Cancellation | None = None,
        attempt: int = 1,
        note: str | None = None,
    ) -> events.Lyrics:
        line = f"{brief.customer_name}, {brief.region}"
        return events.Lyrics(
            title=brief.customer_name,
            language=brief.language,
            sections=(events.LyricSection(kind="verse", lines=(line,)),),
        )
