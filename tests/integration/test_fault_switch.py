"""A stage's fault switch: faults set in its own table while it runs, read at every provider call and trigger.

While the stage's database is out the switch gives the configured faults: an outage costs the work nothing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest
import sqlalchemy as sa
from castad_faults import outage
from castad_runtime import db
from castad_runtime.stage import cancellation, errors, faults

pytestmark = pytest.mark.integration


def test_the_switch_reads_the_faults_set_while_it_runs_and_the_configured_ones_while_none_are_set(
    engines: Mapping[str, sa.Engine],
):
    engine = engines["lyric"]
    configured = faults.Faults(latency_s=0.01)
    injector = faults.FaultInjector(faults.Switch(engine, configured), random.Random(0))
    assert injector.call(lambda: "ok", cancellation.Cancellation()) == "ok"

    with db.transaction(engine) as conn:
        faults.inject(conn, faults.Faults(failure_rate=1, retryable=False, handler_rate=1))
    with pytest.raises(errors.ProviderError) as failed:
        injector.call(lambda: "ok", cancellation.Cancellation())
    assert (failed.value.code, failed.value.retryable) == ("injected_fault", False)
    with pytest.raises(faults.InjectedHandlerFault):
        injector.handler()

    with db.transaction(engine) as conn:  # set again: one row, the newest faults
        faults.inject(conn, faults.Faults(hang_rate=0.5))
    assert faults.Switch(engine, configured)() == faults.Faults(hang_rate=0.5)
    with db.transaction(engine) as conn:
        faults.clear(conn)
    assert faults.Switch(engine, configured)() == configured
    assert injector.call(lambda: "ok", cancellation.Cancellation()) == "ok"
    injector.handler()


def test_while_the_database_is_out_the_switch_gives_the_configured_faults(engines: Mapping[str, sa.Engine]):
    engine = engines["song"]
    configured = faults.Faults(latency_s=0.01)
    switch = faults.Switch(engine, configured)
    with db.transaction(engine) as conn:
        faults.inject(conn, faults.Faults(failure_rate=1))

    with outage.database_down(engine.url.render_as_string(hide_password=False)):
        assert switch() == configured
    assert switch() == faults.Faults(failure_rate=1)
