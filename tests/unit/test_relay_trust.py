"""What the relay trusts a database with.

Each source is named by the service whose outbox it holds, and from it the relay publishes only what that service
may say (castad_relay.ownership).
"""

from __future__ import annotations

import pydantic
import pytest
from castad_contracts import topology
from castad_relay import ownership, settings

LYRIC = "postgresql+psycopg://relay:secret@db:5432/lyric_db?sslmode=require"
SONG = "postgresql+psycopg://relay:secret@db:5432/castad_t1a2b_song"


def test_each_source_is_named_by_its_service_or_by_its_databases_name():
    config = settings.RelaySettings(sources=f"lyric={LYRIC}, {SONG}")

    assert config.sources == {"lyric": LYRIC, "song": SONG}
    assert list(settings.RelaySettings().sources) == list(topology.WITH_DATABASE)


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


TOPOLOGY = topology.Topology("t1")


def row(event_type: str, source: str, destination: str | None = None, routing_key: str | None = None) -> dict:
    return {
        "event_type": event_type,
        "event_source": source,
        "routing_key": routing_key or event_type,
        "destination": destination,
    }


@pytest.mark.parametrize(
    ("service", "candidate"),
    [
        ("lyric", row("lyric.completed", "/castad/lyric")),
        ("api", row("pipeline.cancel_requested", "/castad/api")),
        ("api", row("provider.video.called_back", "/castad/api")),
        ("api", row("lyric.completed", "/castad/lyric", destination="t1.song")),  # a replay keeps its source
    ],
)
def test_a_service_publishes_its_own_types_and_the_gateway_replays_to_a_services_queue(service, candidate):
    assert ownership.refusal(service, candidate, TOPOLOGY) is None


@pytest.mark.parametrize(
    ("service", "candidate", "reason"),
    [
        ("song", row("lyric.completed", "/castad/lyric"), "lyric.completed is lyric's, not song's to publish"),
        ("video", row("pipeline.cancel_requested", "/castad/api"), "is api's, not video's"),
        ("lyric", row("lyric.completed", "/castad/song"), "source '/castad/song', not /castad/lyric"),
        ("lyric", row("song.completed", "/castad/song", routing_key="lyric.completed"), "not its event's type"),
        ("lyric", row(None, None, routing_key="lyric.completed"), "no JSON object with a type and a source"),
        ("lyric", row("lyric.completed", None), "no JSON object with a type and a source"),
        ("api", row("pipeline.exploded", "/castad/api"), "no event type of any service"),
        ("song", row("lyric.completed", "/castad/lyric", destination="t1.video"), "only the gateway's outbox"),
        ("api", row("lyric.completed", "/castad/lyric", destination="t1.dead-letter"), "no service's queue"),
        ("api", row("lyric.completed", "/castad/api", destination="t1.song"), "not its producer's /castad/lyric"),
    ],
)
def test_any_other_row_is_refused_with_the_reason(service, candidate, reason):
    assert reason in (ownership.refusal(service, candidate, TOPOLOGY) or "")
