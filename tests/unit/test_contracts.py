"""The contracts every service shares: brief, envelope, event registry, topology, schemas, error codes."""

from __future__ import annotations

import datetime as dt
import enum
import importlib
import inspect
import json
import pkgutil
import re
import uuid

import pydantic
import pytest
from castad_contracts import api, brief, codes, envelope, events, schemas, topology

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
BRIEF = brief.Brief(customer_name="스테이 머뭄", region="군산", detail_region_info="바다가 보이는 한옥")
ARTIFACT = events.Artifact(uri="file:///tmp/a.txt", sha256="0" * 64, size=3, media_type="text/plain")
LYRICS = events.Lyrics(
    title="머뭄",
    language=brief.Language.KOREAN,
    sections=(events.LyricSection(kind="verse", lines=("군산 바다", "머뭄에서")),),
)


def test_a_brief_has_the_documented_defaults():
    assert BRIEF.genre == "pop, ambient" and BRIEF.style is brief.Style.KPOP
    assert BRIEF.language is brief.Language.KOREAN
    assert BRIEF.orientation is brief.Orientation.VERTICAL
    assert BRIEF.duration_s == brief.DEFAULT_DURATION_S


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"customer_name": ""}, "customer_name", "at least 1 character"),
        ({"customer_name": "a\x07b"}, "customer_name", "control characters"),
        ({"region": "x" * 81}, "region", "at most 80 characters"),
        ({"orientation": "square"}, "orientation", "'vertical' or 'horizontal'"),
        ({"duration_s": 2}, "duration_s", "greater than or equal to 3"),
        ({"duration_s": 181}, "duration_s", "less than or equal to 180"),
        ({"colour": "red"}, "colour", "Extra inputs are not permitted"),
        ({"genre": ""}, "genre", "at least 1 character"),
        ({"genre": "x" * 101}, "genre", "at most 100 characters"),
        ({"language": "French"}, "language", "'Korean', 'English', 'Japanese' or 'Chinese'"),
    ],
)
def test_a_bad_brief_names_the_field_and_the_reason(fields, field, reason):
    document = {"customer_name": "머뭄", "region": "군산", **fields}
    with pytest.raises(pydantic.ValidationError) as raised:
        brief.Brief.model_validate(document)
    errors = raised.value.errors()
    assert [error["loc"][0] for error in errors] == [field]
    assert reason in errors[0]["msg"]


def test_an_envelope_survives_the_wire_unchanged():
    payload = events.LyricCompleted(
        pipeline_id=PIPELINE,
        stage=events.Stage.LYRIC,
        job_id="j-1",
        attempt=2,
        artifact=ARTIFACT,
        completed_at=NOW,
        brief=BRIEF,
        lyrics=LYRICS,
    )
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sent = envelope.wrap(payload, "lyric.completed", "/castad/lyric", traceparent=traceparent)

    received = envelope.Envelope.from_json(sent.to_json())

    assert received == sent
    assert received.subject == PIPELINE
    assert received.traceparent == traceparent
    assert received.payload() == payload
    assert set(json.loads(sent.to_json())) >= {"specversion", "id", "source", "type", "subject", "time"}


def test_an_envelope_is_given_a_version_7_id_later_ones_sorting_after_earlier_ones():
    new = envelope.Envelope
    made = [new(source="/castad/api", type="pipeline.requested", subject=PIPELINE, data={}).id for _ in range(5_000)]

    assert {each.version for each in made} == {7}
    assert made == sorted(made) and len(set(made)) == len(made)  # within one millisecond too
    # The time in its first 48 bits is the time it was made: new ids land at the index's right-hand end.
    made_ms = made[-1].int >> 80
    assert abs(made_ms - dt.datetime.now(dt.UTC).timestamp() * 1000) < 60_000


def test_an_envelope_with_a_version_4_id_still_reads():
    sent = envelope.Envelope(
        id=uuid.UUID("6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"), source="/castad/api", type="x", subject=PIPELINE, data={}
    )

    assert envelope.Envelope.from_json(sent.to_json()).id.version == 4


@pytest.mark.parametrize("pipeline_id", ["p-1", "", PIPELINE.upper(), PIPELINE + "0"])
def test_a_pipeline_id_is_a_lowercase_uuid_in_payload_and_envelope(pipeline_id):
    with pytest.raises(pydantic.ValidationError, match="pipeline_id"):
        events.StageStarted(
            pipeline_id=pipeline_id, stage=events.Stage.LYRIC, job_id="j", attempt=1, started_at=NOW, worker="w"
        )
    with pytest.raises(pydantic.ValidationError, match="subject"):
        envelope.Envelope(source="/x", type="lyric.started", subject=pipeline_id, data={})


def test_wrap_refuses_a_payload_of_the_wrong_type():
    started = events.StageStarted(
        pipeline_id=PIPELINE, stage=events.Stage.LYRIC, job_id="j", attempt=1, started_at=NOW, worker="w"
    )
    with pytest.raises(TypeError, match="lyric.completed v9 carries LyricCompleted, not StageStarted"):
        envelope.wrap(started, "lyric.completed", "/castad/lyric")


def test_an_unknown_type_has_no_payload_model_and_a_newer_version_is_told_apart():
    unknown = envelope.Envelope(source="/x", type="lyric.exploded", subject=PIPELINE, data={})
    with pytest.raises(events.UnknownEventType):
        unknown.payload()
    future = envelope.Envelope(source="/x", type="lyric.started", subject=PIPELINE, schemaversion=99, data={})
    with pytest.raises(events.NewerSchemaVersion, match="version 99 is newer than 2"):
        future.payload()


def test_every_stage_fact_is_registered_with_a_current_version():
    for stage in events.Stage:
        for fact in ("started", "retrying", "completed", "failed"):
            event_type = events.stage_event(stage, fact)
            assert events.REGISTRY.model(event_type, events.REGISTRY.current_version(event_type))
    assert events.PIPELINE_REQUESTED in events.REGISTRY.event_types


def test_each_stage_consumes_what_the_previous_one_completes():
    subscriptions = topology.SUBSCRIPTIONS
    operator = ("pipeline.cancel_requested", "pipeline.retry_requested", "outbox.republish_requested")
    lyric = (events.PIPELINE_REQUESTED, "provider.lyric.called_back", *operator, "pipeline.review_decided")
    assert subscriptions["lyric"].routing_keys == lyric  # it drafts for a review, and takes the decision
    assert subscriptions["song"].routing_keys == ("lyric.completed", "provider.song.called_back", *operator)
    assert subscriptions["video"].routing_keys == ("song.completed", "provider.video.called_back", *operator)
    assert set(subscriptions["api"].routing_keys) == {"lyric.*", "song.*", "video.*"}


@pytest.mark.parametrize(
    ("pattern", "key", "routed"),
    [
        ("lyric.*", "lyric.completed", True),
        ("lyric.*", "song.completed", False),
        ("lyric.*", "lyric", False),
        ("lyric.completed", "lyric.completed", True),
        ("provider.*.called_back", "provider.song.called_back", True),
        ("#", "lyric.completed", True),
        ("lyric.#", "lyric", True),
        ("#.called_back", "provider.song.called_back", True),
        ("*.completed", "provider.song.called_back", False),
        ("lyric.*", "provider.lyric.called_back", False),
        ("provider.#", "provider.song.called_back", True),
    ],
)
def test_a_binding_routes_a_key_as_a_topic_exchange_does(pattern, key, routed):
    assert topology.topic_matches(pattern, key) is routed


def test_the_queues_that_take_an_event_are_its_subscribers_with_the_bindings_that_route_it():
    assert topology.subscribers("lyric.completed") == {"api": ("lyric.*",), "song": ("lyric.completed",)}
    assert topology.subscribers("song.started") == {"api": ("song.*",)}
    assert set(topology.subscribers("pipeline.cancel_requested")) == set(topology.STAGES)
    assert topology.subscribers("nobody.hears") == {}


def test_a_namespace_prefixes_every_name():
    topo = topology.Topology("t1")
    assert topo.exchange == "t1.events"
    assert topo.queue("song") == "t1.song"
    assert topo.dead_letter_queue == "t1.dead-letter"
    assert topo.requeue_exchange(topo.queue("song")) == "t1.song.requeue"


def test_a_broker_user_is_allowed_its_own_names_only():
    topo = topology.Topology("t1")

    def allowed(user: str, kind: str) -> set[str]:
        names = ["t1.events", "t1.dead-letter", "t2.lyric", "t1.lyricx", "amq.default"]  # "": amq.default
        names += [f"t1.{service}{suffix}" for service in topo.services for suffix in ("", ".DQ", ".XQ", ".requeue")]
        return {name for name in names if re.match(getattr(topo.permissions(user), kind), name)}

    # No .XQ: Dramatiq's dead-letter queues are not declared (a queue dead-letters into t1.dead-letter).
    lyric_own = {"t1.lyric", "t1.lyric.DQ", "t1.lyric.requeue"}
    assert allowed("lyric", "configure") == lyric_own
    # A stage files a dead letter by rejecting it on its own queue (the broker names the queue); it cannot
    # publish one, which could name any queue to replay it into. Only the gateway and the relay can.
    assert allowed("lyric", "write") == lyric_own
    assert allowed("lyric", "read") == lyric_own | {"t1.events"}
    api_own = {"t1.api", "t1.api.DQ", "t1.api.requeue"}
    assert allowed("api", "configure") == allowed("api", "read") == api_own | {"t1.events", "t1.dead-letter"}
    assert allowed("api", "write") == api_own | {"t1.dead-letter"}
    # The relay binds the consumers' queues to the events exchange (write on each queue, read on the exchange);
    # not "amq.default": it cannot publish into a queue by name, nor read any.
    queues = {f"t1.{service}" for service in topo.services}
    requeues = {f"t1.{service}.requeue" for service in topo.services}
    assert allowed("relay", "write") == {"t1.events", "t1.dead-letter"} | queues | requeues
    assert allowed("relay", "read") == {"t1.events"}
    assert allowed("relay", "configure") == set()
    with pytest.raises(ValueError, match="no broker user"):
        topo.permissions("postgres")


def test_every_event_gets_a_json_schema_file(tmp_path):
    written = schemas.write_schemas(tmp_path)
    names = {path.name for path in written}
    for (event_type, version), _ in events.REGISTRY.items():
        assert f"{event_type}.v{version}.schema.json" in names
    assert {"envelope.schema.json", "brief.schema.json"} <= names
    song = json.loads((tmp_path / "song.completed.v1.schema.json").read_text())
    assert song["$id"] == "urn:castad:event:song.completed:v1"
    assert {"timed_lines", "artifact", "lyrics"} <= set(song["properties"])


class _StartedV3(events.StageStarted):
    attempt_label: str


class _StartedV4(_StartedV3):
    host: str


def _upgraded_registry() -> events.Registry:
    """lyric.started as a later release would know it: v3 adds `attempt_label`, v4 adds `host`."""
    registry = events.REGISTRY.copy()
    registry.register("lyric.started", 3, _StartedV3, lambda data: {**data, "attempt_label": f"#{data['attempt']}"})
    registry.register("lyric.started", 4, _StartedV4, lambda data: {**data, "host": str(data["worker"]).split("@")[-1]})
    return registry


def test_an_old_version_is_upcast_step_by_step_to_the_newest_model_a_consumer_knows():
    v1 = events.StageStartedV1(pipeline_id=PIPELINE, stage=events.Stage.LYRIC, job_id="j", attempt=2, started_at=NOW)
    old = envelope.Envelope(
        source="/castad/lyric",
        type="lyric.started",
        subject=PIPELINE,
        schemaversion=1,
        data=v1.model_dump(mode="json"),
    )

    read = old.payload(_upgraded_registry())

    assert isinstance(read, _StartedV4)
    assert (read.worker, read.attempt_label, read.host, read.attempt) == (None, "#2", "None", 2)
    # The default registry, which the copy did not change, reads it as its version 2.
    assert type(old.payload()) is events.StageStarted


def test_an_old_version_must_be_valid_under_its_own_model_before_it_is_upcast():
    broken = envelope.Envelope(source="/x", type="lyric.started", subject=PIPELINE, schemaversion=1, data={})
    with pytest.raises(pydantic.ValidationError, match="attempt"):
        broken.payload(_upgraded_registry())


def test_a_version_needs_its_predecessor_and_an_upcast_from_it():
    registry = events.REGISTRY.copy()
    with pytest.raises(ValueError, match="does not follow"):
        registry.register("lyric.started", 4, _StartedV4, lambda data: data)
    with pytest.raises(ValueError, match="upcast"):
        registry.register("lyric.started", 3, _StartedV3)
    with pytest.raises(ValueError, match="upcast"):
        registry.register("lyric.brand_new", 1, events.StageStarted, lambda data: data)
    assert events.REGISTRY.current_version("lyric.started") == 2


@pytest.mark.parametrize("stage", list(events.Stage))
def test_a_started_event_names_its_worker_from_version_2_and_a_version_1_one_reads_with_none(stage):
    started = events.StageStarted(
        pipeline_id=PIPELINE, stage=stage, job_id="j", attempt=3, started_at=NOW, worker="song@host-1:42"
    )
    written = envelope.wrap(started, f"{stage.value}.started", f"/castad/{stage.value}")
    assert written.schemaversion == 2 and written.data["worker"] == "song@host-1:42"
    assert written.payload() == started

    v1 = {"pipeline_id": PIPELINE, "stage": stage.value, "job_id": "j", "attempt": 3, "started_at": NOW.isoformat()}
    read = events.REGISTRY.read(f"{stage.value}.started", 1, v1)
    assert isinstance(read, events.StageStarted) and read.worker is None and read.attempt == 3
    # A producer must say who runs the attempt; version 1 knew no worker, so has none to refuse.
    with pytest.raises(pydantic.ValidationError, match="worker"):
        events.StageStarted.model_validate({k: v for k, v in started.model_dump().items() if k != "worker"})
    with pytest.raises(pydantic.ValidationError, match="worker"):
        events.REGISTRY.read(f"{stage.value}.started", 1, {**v1, "worker": "x"})


def test_a_version_1_event_with_a_brief_is_read_as_the_newest_and_a_version_2_value_is_not_version_1():
    old_brief = {"customer_name": "머뭄", "region": "군산", "genre": "trot", "language": "English"}
    requested = {"pipeline_id": PIPELINE, "brief": old_brief, "requested_at": NOW.isoformat()}

    read = events.REGISTRY.read(events.PIPELINE_REQUESTED, 1, requested)

    assert isinstance(read, events.PipelineRequested) and read.brief.photos == ()
    assert (read.brief.genre, read.brief.style, read.brief.language) == (
        "trot",
        brief.Style.TROT,
        brief.Language.ENGLISH,
    )
    # What only version 2 can say is refused under version 1: an older consumer would hold such an event.
    for newer in ({"genre": "acoustic folk"}, {"language": "Japanese"}):
        with pytest.raises(pydantic.ValidationError):
            events.REGISTRY.read(events.PIPELINE_REQUESTED, 1, {**requested, "brief": {**old_brief, **newer}})


@pytest.mark.parametrize("stage", list(events.Stage))
def test_every_completed_event_carrying_a_brief_reads_version_1(stage):
    completed = {
        "pipeline_id": PIPELINE,
        "stage": stage.value,
        "job_id": "j",
        "attempt": 1,
        "artifact": ARTIFACT.model_dump(mode="json"),
        "completed_at": NOW.isoformat(),
        "brief": {"customer_name": "머뭄", "region": "군산", "genre": "jazz"},
        "lyrics": LYRICS.model_dump(mode="json"),
        "timed_lines": [],
        "song_duration_s": 3.0,
        "width": 144,
        "height": 256,
    }
    event_type = events.stage_event(stage, "completed")
    model = events.REGISTRY.model(event_type, events.REGISTRY.current_version(event_type))
    data = {key: value for key, value in completed.items() if key in model.model_fields}

    read = events.REGISTRY.read(events.stage_event(stage, "completed"), 1, data)

    assert isinstance(read, model) and read.brief.style is brief.Style.JAZZ


PHOTO = brief.Photo(
    id="0d7f3c4e-1a2b-4c3d-8e9f-0a1b2c3d4e5f", owner="b" * 32, sha256="a" * 64, media_type="image/jpeg", size=51_234
)


def test_a_brief_names_up_to_20_photos_by_reference_and_no_more():
    assert brief.Brief(customer_name="머뭄", region="군산", photos=(PHOTO,) * 20).photos[19] == PHOTO
    with pytest.raises(pydantic.ValidationError) as raised:
        brief.Brief(customer_name="머뭄", region="군산", photos=(PHOTO,) * 21)
    assert raised.value.errors()[0]["loc"] == ("photos",) and "at most 20" in raised.value.errors()[0]["msg"]
    for bad in ({"media_type": "image/gif"}, {"size": 0}, {"id": "../etc"}, {"owner": "../x"}, {"bytes": "AAAA"}):
        with pytest.raises(pydantic.ValidationError):
            brief.Photo.model_validate({**PHOTO.model_dump(), **bad})


def test_a_brief_without_photos_dumps_as_before_there_were_any_so_the_previous_version_still_reads_it():
    # The previous version's Brief (a gateway replica or a stage not yet upgraded reads pipelines and jobs with it)
    # was BriefV2's fields, refusing any other.
    assert brief.BriefV2.model_config["extra"] == "forbid" and "photos" not in brief.BriefV2.model_fields
    requested = events.PipelineRequested(pipeline_id=PIPELINE, brief=BRIEF, requested_at=NOW)

    dumps = [
        BRIEF.model_dump(mode="json"),
        json.loads(BRIEF.model_dump_json()),
        envelope.wrap(requested, events.PIPELINE_REQUESTED, "/castad/api").data["brief"],
    ]

    for dumped in dumps:
        assert "photos" not in dumped
        assert brief.BriefV2.model_validate(dumped).model_dump() == BRIEF.model_dump()
    assert BRIEF.model_copy(update={"photos": (PHOTO,)}).model_dump(mode="json")["photos"] == [
        PHOTO.model_dump(mode="json")
    ]


def brief_carrying(event_type: str, version: int, brief_data: dict[str, object]) -> dict[str, object]:
    """A payload of `version` of an event type carrying a brief, the brief as `brief_data`."""
    fields = {
        "pipeline_id": PIPELINE,
        "requested_at": NOW.isoformat(),
        "stage": event_type.split(".")[0],
        "job_id": "j",
        "attempt": 1,
        "artifact": ARTIFACT.model_dump(mode="json"),
        "completed_at": NOW.isoformat(),
        "brief": brief_data,
        "lyrics": LYRICS.model_dump(mode="json"),
        "timed_lines": [],
        "song_duration_s": 3.0,
        "width": 144,
        "height": 256,
    }
    return {
        key: value for key, value in fields.items() if key in events.REGISTRY.model(event_type, version).model_fields
    }


# The newest version of each event carrying a brief.
NEWEST = {events.PIPELINE_REQUESTED: 8, "lyric.completed": 9, "song.completed": 10, "video.completed": 10}
# The last version of each event carrying a brief that knew no photos.
BEFORE_PHOTOS = {
    events.PIPELINE_REQUESTED: 2,
    "lyric.completed": 2,
    "song.completed": 3,
    "video.completed": 2,
}


@pytest.mark.parametrize(("event_type", "version"), BEFORE_PHOTOS.items())
def test_an_event_from_before_photos_reads_as_naming_none_and_photos_need_the_new_version(event_type, version):
    data = brief_carrying(event_type, version, BRIEF.model_dump(mode="json", exclude={"photos"}))

    read = events.REGISTRY.read(event_type, version, data)

    assert events.REGISTRY.current_version(event_type) == NEWEST[event_type]
    assert read.brief.photos == () and read.brief.customer_name == BRIEF.customer_name
    with_photos = {**data, "brief": {**data["brief"], "photos": [PHOTO.model_dump(mode="json")]}}
    assert events.REGISTRY.read(event_type, version + 1, with_photos).brief.photos == (PHOTO,)
    # The old version's model refuses photos: an event naming some is only ever sent as the new version, which a
    # consumer that knows only the old one holds until its upgrade (by the version number, without reading it).
    with pytest.raises(pydantic.ValidationError, match="photos"):
        events.REGISTRY.read(event_type, version, with_photos)


def test_an_event_names_its_photos_by_reference_and_never_carries_their_bytes():
    requested = events.PipelineRequested(
        pipeline_id=PIPELINE, brief=BRIEF.model_copy(update={"photos": (PHOTO,)}), requested_at=NOW
    )
    sent = envelope.wrap(requested, events.PIPELINE_REQUESTED, "/castad/api")
    assert sent.schemaversion == 3  # the first with uploaded photos: a reader of that release reads it
    assert sent.data["brief"]["photos"] == [
        {"id": PHOTO.id, "owner": "b" * 32, "sha256": "a" * 64, "media_type": "image/jpeg", "size": 51_234}
    ]


@pytest.mark.parametrize(
    ("brief_fields", "version"),
    [
        ({}, 1),  # a genre from version 1's list, in Korean: what every release reads
        ({"genre": "lo-fi hip hop, soft synths"}, 2),  # free-text genre
        ({"language": brief.Language.JAPANESE}, 2),
        ({"photos": (PHOTO,)}, 3),  # uploaded photos
        ({"photos": (brief.PhotoLink(url="https://example.com/a.jpg"),)}, 4),  # a photo named by URL
    ],
)
def test_an_event_is_written_as_the_oldest_version_that_carries_it_whole(brief_fields, version):
    source = BRIEF.model_copy(update={"genre": "k-pop", "language": brief.Language.KOREAN, **brief_fields})
    requested = events.PipelineRequested(pipeline_id=PIPELINE, brief=source, requested_at=NOW)

    sent = envelope.wrap(requested, events.PIPELINE_REQUESTED, "/castad/api")

    assert sent.schemaversion == version
    assert sent.payload() == requested  # read back whole, by this release
    if version > 1:  # and by a release that knew only the version before, not at all
        with pytest.raises(events.NewerSchemaVersion):
            sent.payload(events.REGISTRY.until(events.PIPELINE_REQUESTED, version - 1))


def test_the_current_model_of_a_type_names_its_type():
    assert events.REGISTRY.type_of(events.LyricCompleted) == "lyric.completed"
    with pytest.raises(events.UnknownEventType):
        events.REGISTRY.type_of(events.REGISTRY.model(events.PIPELINE_REQUESTED, 1))


# The last version of each event carrying a brief whose photos were uploads only.
BEFORE_PHOTO_LINKS = {
    events.PIPELINE_REQUESTED: 3,
    "lyric.completed": 3,
    "song.completed": 4,
    "video.completed": 3,
}


@pytest.mark.parametrize(("event_type", "version"), BEFORE_PHOTO_LINKS.items())
def test_a_photo_named_by_url_needs_the_newest_version_and_older_ones_read_as_they_are(event_type, version):
    data = brief_carrying(
        event_type, version, {**BRIEF.model_dump(mode="json"), "photos": [PHOTO.model_dump(mode="json")]}
    )

    read = events.REGISTRY.read(event_type, version, data)

    assert events.REGISTRY.current_version(event_type) == NEWEST[event_type]
    assert read.brief.photos == (PHOTO,)
    if event_type == "song.completed":
        assert read.bars_s == ()  # an older song.completed told no bars
    link = {"url": "https://example.com/hall.jpg"}
    with_link = {**data, "brief": {**data["brief"], "photos": [PHOTO.model_dump(mode="json"), link]}}
    assert events.REGISTRY.read(event_type, version + 1, with_link).brief.photos == (PHOTO, brief.PhotoLink(**link))
    with pytest.raises(pydantic.ValidationError, match="photos"):
        events.REGISTRY.read(event_type, version, with_link)


# The last version of each event carrying a brief whose uploads the gateway did not seal.
BEFORE_SEALS = {events.PIPELINE_REQUESTED: 4, "lyric.completed": 4, "song.completed": 5, "video.completed": 5}


@pytest.mark.parametrize(("event_type", "version"), BEFORE_SEALS.items())
def test_a_sealed_photo_needs_the_newest_version_and_an_unsealed_one_is_written_as_before(event_type, version):
    sealed = PHOTO.model_copy(update={"seal": "d" * 64})
    data = brief_carrying(
        event_type, version, {**BRIEF.model_dump(mode="json"), "photos": [PHOTO.model_dump(mode="json")]}
    )
    current = events.REGISTRY.read(event_type, version, data)
    assert current.brief.photos == (PHOTO,) and current.brief.photos[0].seal is None  # read as unsealed

    assert events.REGISTRY.oldest_carrying(event_type, current)[0] <= version  # a release before seals reads it
    with_seal = current.model_copy(update={"brief": current.brief.model_copy(update={"photos": (sealed,)})})
    newest, written = events.REGISTRY.oldest_carrying(event_type, with_seal)
    assert newest == version + 1  # the one after; a completed event's versions since change no brief
    assert written["brief"]["photos"][0]["seal"] == "d" * 64
    with pytest.raises(pydantic.ValidationError, match="seal"):
        events.REGISTRY.read(event_type, version, written)
    link = brief.PhotoLink(url="https://example.com/hall.jpg", seal="e" * 64)  # a photo named by URL: sealed too
    with_link = current.model_copy(update={"brief": current.brief.model_copy(update={"photos": (link,)})})
    assert events.REGISTRY.oldest_carrying(event_type, with_link)[0] == version + 1


# The last version of each completed event whose stage kept its files in the pipeline's folder (the layout before).
BEFORE_STAGE_PLACES = {"lyric.completed": 5, "song.completed": 6, "video.completed": 6}


@pytest.mark.parametrize(("event_type", "version"), BEFORE_STAGE_PLACES.items())
def test_a_file_in_its_stages_own_place_needs_the_new_version_and_one_in_the_pipelines_folder_is_written_as_before(
    event_type, version
):
    """The shape is the same: a release before would read the new place's URI, and refuse its file as another's."""
    stage = events.Stage(event_type.split(".")[0])
    before = events.Artifact(
        uri=f"file:///srv/castad/{PIPELINE}/{stage}-0123456789abcdef.bin", sha256="0" * 64, size=3, media_type="x/y"
    )
    placed = before.model_copy(update={"uri": f"file:///srv/castad/{stage}/{PIPELINE}/{stage}-0123456789abcdef.bin"})
    data = brief_carrying(event_type, version, BRIEF.model_dump(mode="json", exclude={"photos"}))
    current = events.REGISTRY.read(event_type, version, {**data, "artifact": before.model_dump(mode="json")})

    assert events.REGISTRY.current_version(event_type) == NEWEST[event_type] >= version + 1
    assert events.REGISTRY.oldest_carrying(event_type, current)[0] <= version
    moved = current.model_copy(update={"artifact": placed})
    written_as, written = events.REGISTRY.oldest_carrying(event_type, moved)
    assert written_as == version + 1 and events.REGISTRY.read(event_type, written_as, written) == moved
    assert events.in_stage_place(placed.uri, PIPELINE, stage) and not events.in_stage_place(before.uri, PIPELINE, stage)
    other = next(s for s in events.Stage if s != stage)
    assert not events.in_stage_place(placed.uri, PIPELINE, other)  # another stage's place
    assert not events.in_stage_place(f"file:///srv/castad/{stage}/{PIPELINE}/{stage}-x/y.bin", PIPELINE, stage)
    # An s3:// URI too, with its prefix.
    assert events.in_stage_place(f"s3://media/castad/{stage}/{PIPELINE}/{stage}-0.bin", PIPELINE, stage)


def test_a_video_event_whose_fetched_photo_is_in_the_stages_own_place_needs_version_7():
    placed = FETCHED.model_copy(
        update={"file": FETCHED.file.model_copy(update={"uri": FETCHED.file.uri.replace("/castad/", "/castad/video/")})}
    )
    data = brief_carrying("video.completed", 6, BRIEF.model_dump(mode="json", exclude={"photos"}))
    current = events.REGISTRY.read("video.completed", 6, {**data, "fetched_photos": [FETCHED.model_dump(mode="json")]})

    assert events.REGISTRY.oldest_carrying("video.completed", current)[0] == 5  # the first with fetched photos
    assert (
        events.REGISTRY.oldest_carrying("video.completed", current.model_copy(update={"fetched_photos": (placed,)}))[0]
        == 7
    )


def test_a_video_event_naming_its_poster_needs_version_8_and_one_without_is_written_as_before():
    data = brief_carrying("video.completed", 7, BRIEF.model_dump(mode="json", exclude={"photos"}))
    placed = f"file:///srv/castad/video/{PIPELINE}/video-0123456789abcdef.mp4"
    current = events.REGISTRY.read("video.completed", 7, {**data, "artifact": {**data["artifact"], "uri": placed}})
    poster = events.Artifact(uri=placed.replace(".mp4", ".jpg"), sha256="d" * 64, size=9, media_type="image/jpeg")

    assert current.poster is None  # an event from before posters names none
    assert events.REGISTRY.oldest_carrying("video.completed", current)[0] == 7
    with_poster = current.model_copy(update={"poster": poster})
    written_as, written = events.REGISTRY.oldest_carrying("video.completed", with_poster)
    assert (written_as, written["poster"]) == (8, poster.model_dump(mode="json"))
    with pytest.raises(events.NewerSchemaVersion):  # a release before posters holds it for a replica that reads it
        events.REGISTRY.until("video.completed", 7).read("video.completed", 8, written)


# The last version of each event carrying a brief that named no formats.
BEFORE_FORMATS = {events.PIPELINE_REQUESTED: 5, "lyric.completed": 6, "song.completed": 7, "video.completed": 8}


@pytest.mark.parametrize(("event_type", "version"), BEFORE_FORMATS.items())
def test_a_brief_asking_for_several_formats_needs_the_new_version_and_one_format_is_written_as_before(
    event_type, version
):
    data = brief_carrying(event_type, version, {**BRIEF.model_dump(mode="json"), "orientation": "horizontal"})
    current = events.REGISTRY.read(event_type, version, data)
    assert current.brief.frames == (brief.Format.WIDE,)  # an older brief asks for its orientation's format

    assert events.REGISTRY.oldest_carrying(event_type, current)[0] <= version
    several = current.brief.model_validate({**data["brief"], "formats": ["1:1", "9:16"]})
    asking = current.model_copy(update={"brief": several})
    if event_type == "video.completed":  # and it made each
        made = events.Render(format=brief.Format.VERTICAL, artifact=ARTIFACT, width=144, height=256)
        asking = asking.model_copy(update={"more_formats": (made,)})
    written_as, written = events.REGISTRY.oldest_carrying(event_type, asking)
    assert written_as == version + 1 and written["brief"]["formats"] == ["1:1", "9:16"]
    with pytest.raises(events.NewerSchemaVersion):  # a release before formats holds it for a replica that reads it
        events.REGISTRY.until(event_type, version).read(event_type, version + 1, written)
    with pytest.raises(pydantic.ValidationError, match="formats"):  # its model would refuse it, were it read so
        events.REGISTRY.read(event_type, version, written)


@pytest.mark.parametrize(("event_type", "version"), BEFORE_FORMATS.items())
def test_a_brief_with_a_brand_needs_the_new_version_and_reads_back_whole(event_type, version):
    data = brief_carrying(event_type, version, BRIEF.model_dump(mode="json"))
    current = events.REGISTRY.read(event_type, version, data)
    assert current.brief.brand is None  # an older brief has none
    logo = PHOTO.model_copy(update={"seal": "d" * 64})
    brand = brief.Brand(logo=logo, colors=("#0B3D91", "#ffc20e"), font=brief.FontFamily.NOTO_SANS_CJK)
    branded = current.model_copy(update={"brief": current.brief.model_copy(update={"brand": brand})})

    written_as, written = events.REGISTRY.oldest_carrying(event_type, branded)

    assert written_as == version + 1 and written["brief"]["brand"]["colors"] == ["#0b3d91", "#ffc20e"]
    assert events.REGISTRY.read(event_type, written_as, written).brief.brand == brand


@pytest.mark.parametrize(
    "brand",
    [{"colors": []}, {"colors": ["#fff"]}, {"colors": ["#000000"] * 3}, {"colors": ["#000000"], "font": "Comic Sans"},
     {"colors": ["#000000"], "caption_style": {"position": "left"}}, {"colors": ["#000000"], "motto": "x"}],
    ids=["no-colour", "short-hex", "three-colours", "unknown-font", "unknown-position", "unknown-field"],
)  # fmt: skip
def test_a_brand_that_is_not_one_is_refused(brand):
    with pytest.raises(pydantic.ValidationError, match="brand"):
        brief.Brief.model_validate({**BRIEF.model_dump(mode="json"), "brand": brand})


@pytest.mark.parametrize(
    ("formats", "orientation", "frames"),
    [
        ((), "vertical", ("9:16",)),
        ((), "horizontal", ("16:9",)),
        (("16:9",), "vertical", ("16:9",)),  # the one format says the orientation
        (("1:1",), "horizontal", ("1:1",)),
        (("16:9", "1:1", "9:16"), "vertical", ("16:9", "1:1", "9:16")),
    ],
)
def test_a_briefs_formats_are_its_orientations_unless_it_names_them_and_one_it_names_first_sets_the_orientation(
    formats, orientation, frames
):
    asked = brief.Brief.model_validate(
        {**BRIEF.model_dump(mode="json"), "orientation": orientation, "formats": formats}
    )

    assert asked.frames == frames
    if frames[0] in brief.FORMAT_ORIENTATION:
        assert asked.orientation == brief.FORMAT_ORIENTATION[brief.Format(frames[0])]
    # A brief whose orientation says its one format names none: it reads as a brief from before formats.
    assert ("formats" in asked.model_dump(mode="json")) == (len(frames) > 1 or frames == ("1:1",))
    assert brief.Brief.model_validate(asked.model_dump(mode="json")) == asked


def test_a_request_without_formats_is_sent_as_a_gateway_of_a_release_before_formats_takes_it():
    """A request of the release before: the brief's fields then, its photos and callback URL; nothing else."""
    before = set(brief.BriefV2.model_fields) | {"photos", "callback_url"}
    asked = api.PipelineRequest(customer_name="Cafe Blue", region="Busan", photos=["https://example.com/a.jpg"])

    sent = json.loads(asked.model_dump_json(exclude_none=True))

    assert set(sent) <= before and "orientation" not in sent and "formats" not in sent
    assert "formats" in json.loads(asked.model_copy(update={"formats": tuple(brief.Format)}).model_dump_json())


@pytest.mark.parametrize("formats", [{"a": 1}, [["9:16"]], [{"shape": "1:1"}], "9:16", [7]])
def test_formats_that_are_not_a_list_of_names_are_refused_as_the_briefs_field_not_as_a_crash(formats):
    with pytest.raises(pydantic.ValidationError, match="formats"):
        brief.Brief.model_validate({**BRIEF.model_dump(mode="json"), "formats": formats})


def test_a_brief_naming_a_format_twice_or_an_unknown_one_is_refused():
    with pytest.raises(pydantic.ValidationError, match="names the same format more than once"):
        brief.Brief.model_validate({**BRIEF.model_dump(mode="json"), "formats": ["1:1", "1:1"]})
    with pytest.raises(pydantic.ValidationError, match="formats"):
        brief.Brief.model_validate({**BRIEF.model_dump(mode="json"), "formats": ["4:5"]})


def test_a_video_event_in_several_formats_names_each_ones_video_and_poster_the_first_its_own():
    data = brief_carrying("video.completed", 8, BRIEF.model_dump(mode="json"))
    placed = f"file:///srv/castad/video/{PIPELINE}/video-0123456789abcdef.mp4"
    current = events.REGISTRY.read("video.completed", 8, {**data, "artifact": {**data["artifact"], "uri": placed}})
    square = events.Render(
        format=brief.Format.SQUARE,
        artifact=current.artifact.model_copy(update={"uri": placed.replace("0123", "4567"), "sha256": "e" * 64}),
        width=144,
        height=144,
    )
    both = current.model_copy(
        update={
            "brief": current.brief.model_copy(update={"formats": tuple(brief.Format)[:2]}),
            "more_formats": (square,),
        }
    )

    assert [render.format for render in current.renders()] == ["9:16"]
    assert [(render.format, render.artifact, render.width) for render in both.renders()] == [
        ("9:16", current.artifact, 144),
        ("1:1", square.artifact, 144),
    ]
    written_as, written = events.REGISTRY.oldest_carrying("video.completed", both)
    assert written_as == 9 and events.REGISTRY.read("video.completed", 9, written) == both
    # A producer that names other formats than the brief's after its first, or none of them, is refused.
    for told in ([], [square.model_dump(mode="json")] * 2):
        with pytest.raises(pydantic.ValidationError, match="not the brief's after its first"):
            events.VideoCompleted.model_validate({**written, "more_formats": told})


LINKED = brief.PhotoLink(url="https://example.com/hall.jpg")
FETCHED = events.FetchedPhoto(
    photo=1,
    url=LINKED.url,
    file=events.Artifact(
        uri=f"file:///srv/castad/{PIPELINE}/video-0123456789abcdef-{'c' * 16}.jpg",
        sha256="c" * 64,
        size=48_210,
        media_type="image/jpeg",
    ),
    width=1280,
    height=960,
)


def test_a_video_4_event_reads_as_one_that_fetched_no_photos_and_fetched_photos_need_version_5():
    data = brief_carrying(
        "video.completed",
        4,
        {**BRIEF.model_dump(mode="json"), "photos": [PHOTO.model_dump(mode="json"), LINKED.model_dump(mode="json")]},
    )

    read = events.REGISTRY.read("video.completed", 4, data)

    assert isinstance(read, events.VideoCompleted) and read.fetched_photos == ()
    assert read.brief.photos == (PHOTO, LINKED) and (read.width, read.height) == (144, 256)
    fetched = {**data, "fetched_photos": [FETCHED.model_dump(mode="json")]}
    assert events.REGISTRY.read("video.completed", 5, fetched).fetched_photos == (FETCHED,)
    with pytest.raises(pydantic.ValidationError, match="fetched_photos"):
        events.REGISTRY.read("video.completed", 4, fetched)


def test_a_fetched_photo_is_told_by_reference_and_never_carries_its_bytes():
    completed = events.VideoCompleted.model_validate(
        {
            **brief_carrying(
                "video.completed", 5, BRIEF.model_copy(update={"photos": (PHOTO, LINKED)}).model_dump(mode="json")
            ),
            "fetched_photos": [FETCHED.model_dump(mode="json")],
        }
    )
    sent = envelope.wrap(completed, "video.completed", "/castad/video")

    assert sent.schemaversion == 5
    assert sent.data["fetched_photos"] == [
        {
            "photo": 1,
            "url": LINKED.url,
            "file": {"uri": FETCHED.file.uri, "sha256": "c" * 64, "size": 48_210, "media_type": "image/jpeg"},
            "width": 1280,
            "height": 960,
        }
    ]
    for bad in ({"photo": -1}, {"width": 0}, {"bytes": "AAAA"}):
        with pytest.raises(pydantic.ValidationError):
            events.FetchedPhoto.model_validate({**FETCHED.model_dump(mode="json"), **bad})


def test_the_dead_letter_queue_has_no_delivery_limit_on_either_major_version_of_rabbitmq():
    """RabbitMQ 4 limits every quorum queue to 20 returns unless told -1.

    RabbitMQ 3 has no limit by default and would drop a message at its first return if told -1 (tried on 3.10.8).
    """
    assert "x-delivery-limit" not in topology.Topology.dead_letter_queue_arguments(3)
    assert topology.Topology.dead_letter_queue_arguments(4)["x-delivery-limit"] == -1


def test_every_event_type_has_one_producer_with_a_source_of_its_own():
    assert set(topology.PRODUCERS) == set(events.REGISTRY.event_types)
    assert {service: f"/castad/{service}" for service in ("api", "lyric", "song", "video")} == topology.SOURCES
    assert topology.PRODUCERS["pipeline.requested"] == topology.PRODUCERS["provider.song.called_back"] == "api"
    assert {topology.PRODUCERS[events.stage_event(stage, "completed")] for stage in events.Stage} == {
        "lyric",
        "song",
        "video",
    }


def test_every_error_code_is_its_own_word_with_a_one_line_meaning():
    names, members = codes.ErrorCode.__members__, list(codes.ErrorCode)
    assert len(names) == len(members), "two names share one value: an alias, not a code"
    for code in members:
        assert re.fullmatch(r"[a-z][a-z0-9_]{0,63}", code), code  # a metric's label value (metrics.ERROR_CODE)
        assert code.meaning and "\n" not in code.meaning and len(code.meaning) <= 120, code


def test_an_error_code_is_found_by_its_value_and_an_unknown_one_is_none():
    assert codes.ErrorCode.known("render_failed") is codes.ErrorCode.RENDER_FAILED
    assert codes.ErrorCode.known("a_newer_stages_code") is None
    assert json.dumps({"code": codes.ErrorCode.OUTAGE}) == '{"code": "outage"}'


def test_a_field_a_later_version_added_is_left_out_of_an_older_one_when_it_holds_nothing():
    """song.completed version 5 added the bars: a song without them is carried whole by version 1 still."""
    lyrics = events.Lyrics(
        title="t", language=brief.Language.KOREAN, sections=(events.LyricSection(kind="verse", lines=("a",)),)
    )
    artifact = events.Artifact(uri="file:///song.mp3", sha256="0" * 64, size=1, media_type="audio/mpeg")
    song = events.SongCompleted(
        pipeline_id=PIPELINE,
        stage=events.Stage.SONG,
        job_id=PIPELINE,
        attempt=1,
        artifact=artifact,
        completed_at=NOW,
        brief=BRIEF.model_copy(update={"genre": "k-pop", "language": brief.Language.KOREAN}),
        lyrics=lyrics,
        timed_lines=(),
        song_duration_s=3.0,
    )

    assert envelope.wrap(song, "song.completed", "/castad/song").schemaversion == 1
    with_bars = envelope.wrap(song.model_copy(update={"bars_s": (0.0, 2.0)}), "song.completed", "/castad/song")
    assert with_bars.schemaversion == 5 and with_bars.data["bars_s"] == [0.0, 2.0]


# The last version of each event carrying a brief that told no share and no provider calls.
BEFORE_SHARES = {events.PIPELINE_REQUESTED: 7, "lyric.completed": 8, "song.completed": 9, "video.completed": 9}


@pytest.mark.parametrize(("event_type", "version"), BEFORE_SHARES.items())
def test_a_share_or_provider_calls_need_the_new_version_and_an_event_with_neither_is_written_as_before(
    event_type, version
):
    data = brief_carrying(event_type, version, BRIEF.model_dump(mode="json", exclude={"photos"}))
    current = events.REGISTRY.read(event_type, version, data)
    assert events.REGISTRY.oldest_carrying(event_type, current)[0] <= version  # a release before reads it

    told = {"share": events.Share(tenant="acme", weight=3)} if "share" in type(current).model_fields else {}
    if event_type != events.PIPELINE_REQUESTED:
        told["provider_calls"] = 2
    if event_type == "video.completed":
        told["duration_s"] = 3.0
    for field, value in told.items():
        newer = current.model_copy(update={field: value})
        written_as, written = events.REGISTRY.oldest_carrying(event_type, newer)
        assert written_as == version + 1 and written[field] == (
            value.model_dump(mode="json") if isinstance(value, events.Share) else value
        )
        assert events.REGISTRY.read(event_type, written_as, written) == newer


@pytest.mark.parametrize("fact", ["retrying", "failed", "canceled"])
def test_an_attempts_end_telling_provider_calls_needs_version_2_and_one_telling_none_is_version_1(fact):
    model = events.REGISTRY.model(f"song.{fact}", 2)
    fields = {
        "pipeline_id": PIPELINE,
        "stage": "song",
        "job_id": "j",
        "attempt": 1,
        "max_attempts": 3,
        "error_code": "provider_error",
        "error_message": "m",
        "next_attempt_at": NOW,
        "failed_at": NOW,
        "operation": 1,
        "reason": "r",
        "canceled_at": NOW,
    }
    payload = model(**{name: value for name, value in fields.items() if name in model.model_fields})

    assert events.REGISTRY.oldest_carrying(f"song.{fact}", payload)[0] == 1
    told = payload.model_copy(update={"provider_calls": 1})
    assert events.REGISTRY.oldest_carrying(f"song.{fact}", told) == (2, {**told.model_dump(mode="json")})
    with pytest.raises(pydantic.ValidationError):
        events.Share(tenant="acme", weight=events.MAX_SHARE_WEIGHT + 1)


def test_every_body_and_enumeration_of_the_api_is_read_from_api_itself():
    """The API's modules are how it is kept; a client reads one vocabulary, `api.X`, nested bodies included."""
    modules = [importlib.import_module(f"{api.__name__}.{found.name}") for found in pkgutil.iter_modules(api.__path__)]
    kept_apart = [
        f"{module.__name__}.{name}"
        for module in modules
        for name, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__ and not name.startswith("_")
        if issubclass(value, pydantic.BaseModel | enum.Enum) and name not in api.__all__
    ]
    assert kept_apart == []
