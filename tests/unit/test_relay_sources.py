"""The relay's sources: each database named by the service whose outbox it holds, which decides what the
relay may publish from it."""

from __future__ import annotations

import pydantic
import pytest
from castad_relay import settings

LYRIC = "postgresql+psycopg://relay:secret@db:5432/lyric_db?sslmode=require"
SONG = "postgresql+psycopg://relay:secret@db:5432/castad_t1a2b_song"


def test_each_source_is_named_by_its_service_or_by_its_databases_name():
    config = settings.RelaySettings(sources=f"lyric={LYRIC}, {SONG}")

    assert config.sources == {"lyric": LYRIC, "song": SONG}
    assert list(settings.RelaySettings().sources) == ["api", "lyric", "song", "video"]


@pytest.mark.parametrize(
    ("sources", "complaint"),
    [
        ("postgresql+psycopg://relay@db/outboxes", "does not say whose outbox it is"),
        (f"relay={LYRIC}", "no service 'relay' has an outbox"),
        (f"lyric={LYRIC},lyric={SONG}", "two databases of lyric"),
        (f"lyric={LYRIC},song={LYRIC}", "one database for two services"),
        ("lyric=mysql://db/lyric", "not a PostgreSQL URL"),
        ("", "at least one database URL"),
    ],
)
def test_a_source_whose_service_is_unknown_or_ambiguous_is_refused(sources, complaint):
    with pytest.raises(pydantic.ValidationError, match=complaint) as refused:
        settings.RelaySettings(sources=sources)
    assert "secret@" not in str(refused.value).split("[type=")[0]  # the password is masked in the reason
