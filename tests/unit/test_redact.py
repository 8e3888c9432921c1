"""What leaves a process: credentials masked everywhere, errors described without their data."""

from __future__ import annotations

import io
import logging

import psycopg
import pytest
import sqlalchemy as sa
from castad_api import settings as api_settings
from castad_runtime import cli, logs, redact


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (
            "postgresql+psycopg://castad:s3cr%40t@db:5432/castad_api",
            "postgresql+psycopg://castad:***@db:5432/castad_api",
        ),
        (
            "amqp://guest:guest@127.0.0.1:5672/%2F and amqps://u:p@h/v",
            "amqp://guest:***@127.0.0.1:5672/%2F and amqps://u:***@h/v",
        ),
        ("host=db user=castad password=hunter2 dbname=x", "host=db user=castad password=*** dbname=x"),
        ("PASSWORD = 'two words'", "PASSWORD = ***"),
        ("Pwd=abc;Server=db", "Pwd=***"),
        ("AUTHORIZATION: BEARER abc", "AUTHORIZATION: BEARER ***"),
        ("paſſword=hunter2", "paſſword=***"),
        ("postgresql://postgres@127.0.0.1/db (no password)", "postgresql://postgres@127.0.0.1/db (no password)"),
        ("https://example.com/path:8000", "https://example.com/path:8000"),
        ("Authorization: Bearer abc.def-ghi, next", "Authorization: Bearer ***, next"),
        ("Incorrect API key provided: sk-proj-ab12****wxyz.", "Incorrect API key provided: ***."),
        ("a task-list and sk- alone", "a task-list and sk- alone"),
        ("Input should be valid: 'whsec_c2hvcnQ='", "Input should be valid: '***'"),
    ],
)
def test_every_password_in_a_url_or_connection_string_is_masked(text, masked):
    assert redact.mask(text) == masked


def test_a_database_error_is_described_without_its_statement_or_parameters():
    error = sa.exc.IntegrityError(
        "INSERT INTO pipelines (brief) VALUES (%(brief)s)",
        {"brief": "스테이 머뭄, 비밀 메모"},
        psycopg.errors.UniqueViolation('duplicate key value violates unique constraint "pk"\nDETAIL: Key (id)=(42)'),
    )

    described = redact.describe(error)

    assert described == 'UniqueViolation: duplicate key value violates unique constraint "pk"'
    assert "비밀" not in described and "INSERT" not in described and "42" not in described


def test_a_long_description_is_cut():
    assert len(redact.describe(RuntimeError("x" * 5000))) == redact.DESCRIPTION_MAX


def test_a_rejected_setting_names_the_variable_and_masks_the_password(monkeypatch, capsys):
    monkeypatch.setenv("CASTAD_API_DATABASE_URL", "mysql://castad:hunter2@db/castad")

    with pytest.raises(SystemExit) as exited:
        try:
            cli.load_settings(api_settings.ApiSettings)
        except Exception as error:  # typer.Exit is a click exception, not SystemExit
            raise SystemExit(getattr(error, "exit_code", 1)) from None

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "CASTAD_API_DATABASE_URL='mysql://castad:***@db/castad'" in err
    assert "hunter2" not in err


def test_log_lines_mask_credentials_in_messages_and_tracebacks(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("test")
        log = logging.getLogger("castad.test")
        log.warning("connecting to %s", "amqp://castad:hunter2@broker:5672/")
        try:
            raise ConnectionError("cannot reach postgresql://castad:hunter2@db/castad")
        except ConnectionError:
            log.exception("failed")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]

    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert all("castad:***@" in line and "hunter2" not in line for line in lines)


SIGNATURE = "9f2c" * 16  # a link's HMAC-SHA256, as the stages sign it
AMZ = "b7e3a1c4d5" * 6 + "abcd"


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        (f"GET /v1/links/pipelines/p/artifacts/song?expires=1767225600&signature={SIGNATURE}", SIGNATURE),
        (f"https://gw/x?Signature={SIGNATURE}&expires=1", SIGNATURE),
        (f"https://gw/x?SIGNATURE={SIGNATURE}", SIGNATURE),
        (f"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature={AMZ}", AMZ),
        (
            "https://b.s3.amazonaws.com/k?x-amz-credential=AKIAEXAMPLE%2F20261127%2Fus-east-1&x-amz-date=1",
            "AKIAEXAMPLE",
        ),
        ("https://b/k?X-Amz-Security-Token=IQoJb3JpZ2luX2VjEXAMPLE&x=1", "IQoJb3JpZ2luX2VjEXAMPLE"),
        ("https://api/x?api_key=abcdef0123456789&q=1", "abcdef0123456789"),
        ("https://api/x?token=tok-0123456789", "tok-0123456789"),
        (f"fetch https%3A%2F%2Fb%2Fk%3FX-Amz-Signature%3D{AMZ}%26x%3D1", AMZ),
        ("Authorization: Bearer cad_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcd", "AbCdEfGhIjKl"),
        ("key cad_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcd was revoked", "AbCdEfGhIjKl"),
    ],
)
def test_signatures_tokens_and_api_keys_are_masked_whatever_their_case(text, gone):
    masked = redact.mask(text)
    assert gone not in masked and redact.MASK in masked


def test_the_shown_start_of_a_key_and_ordinary_words_are_left_alone():
    for text in (
        "key cad_AbCdEfGh (12 characters shown)",
        "castad_api started",
        "designature=x",
        "?expires=1767225600",
    ):
        assert redact.mask(text) == text


def test_a_secret_the_process_knows_is_masked_whatever_its_shape():
    key = "9b1e6f3a-suno-style-key-7c2d"  # a provider's key has no shape of its own
    redact.known(key)
    assert redact.mask(f"the music API refused {key}: bad") == f"the music API refused {redact.MASK}: bad"


def test_log_lines_mask_links_presigned_urls_and_keys(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("test")
        log = logging.getLogger("castad.test")
        log.warning(
            "render fetches %s", f"https://gw/v1/links/pipelines/p/artifacts/song?expires=1&signature={SIGNATURE}"
        )
        log.warning("redirect to https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAX%%2F1&X-Amz-Signature=%s", AMZ)
        log.warning("made key %s", "cad_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcd")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]

    text = stream.getvalue()
    assert SIGNATURE not in text and AMZ not in text and "AKIAX" not in text and "IjKlMnOp" not in text
    assert text.count(redact.MASK) == 4
