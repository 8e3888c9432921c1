"""The local tooling's facts about each service cover exactly the services the contracts name."""

from __future__ import annotations

from castad_contracts import topology
from castad_local import charts, stack


def test_castad_admin_knows_every_service_of_the_contracts_and_no_other():
    assert tuple(charts.SETTINGS) == topology.SERVICES  # each chart's settings block
    assert set(stack.PROBE_PORTS) == set(topology.SERVICES)  # where `make up` serves its probes
    assert tuple(database.service for database in stack.DATABASES) == topology.WITH_DATABASE
