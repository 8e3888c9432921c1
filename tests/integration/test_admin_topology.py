"""`castad-admin topology`.

The whole topology declared ahead of the services, as an operator does once with the users (docs/deploy.md), so
that no event is refused as unroutable for a consumer not started yet.
"""

from __future__ import annotations

import uuid

import pytest
from castad_contracts import topology
from castad_local import admin
from castad_runtime import messaging
from typer.testing import CliRunner

from tests.integration.helpers import Amqp
from tests.support.servers import AMQP_URL

pytestmark = pytest.mark.integration


def test_with_the_topology_declared_and_no_service_started_every_event_reaches_its_consumers_queues():
    topo = topology.Topology(f"test-topology-{uuid.uuid4().hex[:8]}")
    try:
        done = CliRunner().invoke(
            admin.app, ["topology", "--namespace", topo.namespace], env={"CASTAD_AMQP_URL": AMQP_URL}
        )
        assert done.exit_code == 0, done.output
        assert f"namespace {topo.namespace!r} declared" in done.output
        # The events the stages subscribe to (the gateway's bindings are patterns that match their facts).
        keys = {key for service in topo.services for key in topo.bindings(service) if "*" not in key}
        amqp = Amqp(AMQP_URL)
        try:
            for key in sorted(keys):
                amqp.publish(topo.exchange, key, b"{}")  # mandatory and confirmed: a return would raise
            expected = {service: len(set(topo.bindings(service))) for service in topo.services}
            expected["api"] = len([key for key in keys if key.startswith(("lyric.", "song.", "video."))])
            assert {service: amqp.depth(topo.queue(service)) for service in topo.services} == expected
        finally:
            amqp.close()
    finally:
        messaging.delete_topology(AMQP_URL, topo)


def test_a_broker_it_cannot_reach_is_one_line_and_exit_status_1_without_the_password():
    done = CliRunner().invoke(
        admin.app, ["topology"], env={"CASTAD_AMQP_URL": "amqp://castad_admin:s3cret-pw@127.0.0.1:1/%2F"}
    )
    assert done.exit_code == 1
    [line] = done.output.strip().splitlines()
    assert line.startswith("could not declare the topology") and "s3cret-pw" not in line
