"""Structured JSON logs carrying pipeline_id, event_id and trace_id, credentials masked."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator

from pythonjsonlogger import json as jsonlogger

from castad_runtime import redact, telemetry

_pipeline_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pipeline_id", default=None)
_event_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("event_id", default=None)


class _ContextFilter(logging.Filter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.pipeline_id = _pipeline_id.get()
        record.event_id = _event_id.get()
        record.trace_id = telemetry.current_trace_id()
        return True


class _MaskingFormatter(jsonlogger.JsonFormatter):
    """JSON lines with every credential masked, wherever it appears (a message, an exception, a field)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact.mask(super().format(record))


def setup(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter(service))
    handler.setFormatter(
        _MaskingFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(service)s %(pipeline_id)s %(event_id)s %(trace_id)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Chatty libraries say only what matters even at DEBUG; botocore's DEBUG lines would print every request's
    # signature and the presigned URLs' ones ("Signature:\n<hex>"), which no mask can tell from other hex.
    for noisy in (
        "pika",
        "aio_pika",
        "aiormq",
        "httpx",
        "httpcore",
        "uvicorn.access",
        "botocore",
        "boto3",
        "s3transfer",
        "urllib3",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextlib.contextmanager
def bound(pipeline_id: str | None, event_id: str | None = None) -> Iterator[None]:
    tokens = (_pipeline_id.set(pipeline_id), _event_id.set(event_id))
    try:
        yield
    finally:
        _pipeline_id.reset(tokens[0])
        _event_id.reset(tokens[1])
