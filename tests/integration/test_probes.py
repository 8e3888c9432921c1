"""The gateway's probes and metrics.

Readiness read at most once a second or two, on connections it keeps (not a new PostgreSQL and AMQP connection per
call), and with CASTAD_API_HEALTH_PORT served on that port alone, as the stages serve theirs, never on the API
port.
"""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
from castad_local import stack
from castad_runtime import amqp

pytestmark = pytest.mark.integration


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """New connections to PostgreSQL and RabbitMQ made from now on in this process, by kind."""
    made = {"postgresql": 0, "rabbitmq": 0}
    pg_connect, amqp_connect = psycopg.connect, amqp.blocking_connection

    def counted_pg(*args: Any, **kwargs: Any) -> Any:
        made["postgresql"] += 1
        return pg_connect(*args, **kwargs)

    def counted_amqp(*args: Any, **kwargs: Any) -> Any:
        made["rabbitmq"] += 1
        return amqp_connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", counted_pg)  # the probes' own and SQLAlchemy's pools' alike
    monkeypatch.setattr(amqp, "blocking_connection", counted_amqp)
    return made


def test_readiness_is_read_at_most_once_a_second_on_connections_it_keeps(api, connections):
    anonymous = api().client(None)
    answers = [anonymous.get("/readyz") for _ in range(20)]

    assert {answer.status_code for answer in answers} == {200}
    assert answers[-1].json() == {"status": "ready", "checks": {"database": "ok", "rabbitmq": "ok"}}
    assert connections["rabbitmq"] <= 1 and connections["postgresql"] <= 1, connections


def test_with_a_health_port_the_probes_and_metrics_leave_the_api_port(api):
    probe_port = stack.free_port()
    running = api(health_port=probe_port)
    anonymous = running.client(None)

    for path in ("/healthz", "/readyz", "/metrics"):
        assert anonymous.get(path).status_code == 404, path
    assert not {"/healthz", "/readyz", "/metrics"} & set(anonymous.get("/openapi.json").json()["paths"])
    probes = f"http://127.0.0.1:{probe_port}"
    assert httpx.get(f"{probes}/healthz", timeout=5).status_code == 200
    ready = httpx.get(f"{probes}/readyz", timeout=5)
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "rabbitmq": "ok"}
    page = httpx.get(f"{probes}/metrics", timeout=5).text
    assert "castad_http_requests_total" in page and "castad_api_auth_failures_total" in page
