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
