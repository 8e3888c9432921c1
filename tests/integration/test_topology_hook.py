"""A chart's hook Job declares its service's part of the topology before any of its pods starts.

`python -m castad_<service> declare`, with a broker user that may configure the vhost: the events a stage takes
reach its queue from then on, whichever service starts first, and nothing else is declared.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from castad_contracts import topology
from castad_lyric import service as lyric_service
from castad_runtime import messaging
from typer.testing import CliRunner

from tests.integration.helpers import Amqp, pipeline_requested
from tests.support.servers import AMQP_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def topo() -> Iterator[topology.Topology]:
    topo = topology.Topology(f"test-hook-{uuid.uuid4().hex[:8]}")
    try:
        yield topo
    finally:
        messaging.delete_topology(AMQP_URL, topo)


def declare(topo: topology.Topology, amqp_url: str = AMQP_URL) -> tuple[int, str]:
    done = CliRunner().invoke(
        lyric_service.app,
        ["declare"],
        env={"CASTAD_NAMESPACE": topo.namespace, "CASTAD_TOPOLOGY_AMQP_URL": amqp_url},
    )
    return done.exit_code, done.output


def test_the_hook_declares_the_stages_queue_bound_to_what_it_takes_on_an_empty_broker(topo):
    code, output = declare(topo)
    assert (code, output) == (0, f"lyric: queues and bindings declared in {topo.namespace}\n")

    amqp = Amqp(AMQP_URL)
    try:
        request = pipeline_requested().model_dump_json().encode()
        amqp.publish(topo.exchange, "pipeline.requested", request)  # unroutable would be returned
        assert [taken.routing_key for taken in amqp.take(topo.queue("lyric"), 1)] == ["pipeline.requested"]
        states = {state.name: state.kind for state in messaging.queue_states(AMQP_URL, topo)}
    finally:
        amqp.close()
    assert states[topo.queue("lyric")] == messaging.QUORUM
    assert states[topo.dead_letter_queue] == messaging.QUORUM
    assert states[topo.queue("song")] == messaging.MISSING  # another chart's hook declares its own

    assert declare(topo)[0] == 0  # again, at the next upgrade: nothing changes


def test_an_unreachable_broker_is_one_line_and_exit_code_3(topo):
    code, output = declare(topo, "amqp://guest:secret-word@127.0.0.1:1/")

    assert code == 3
    assert output.startswith("lyric: cannot declare: broker: ") and output.count("\n") == 1
    assert "secret-word" not in output


def test_without_an_administrators_url_the_hook_says_which_variable_is_missing(topo):
    done = CliRunner().invoke(lyric_service.app, ["declare"], env={"CASTAD_NAMESPACE": topo.namespace})

    assert done.exit_code == 2
    assert "CASTAD_TOPOLOGY_AMQP_URL" in done.output
