"""Which confirmed rows the relay may mark published without breaking per-pipeline order."""

from __future__ import annotations

from castad_relay import relay


def rows(*pipelines: str) -> list[dict[str, object]]:
    return [{"id": index, "pipeline_id": pipeline} for index, pipeline in enumerate(pipelines, start=1)]


def test_every_confirmed_row_is_published():
    assert relay.publishable(rows("a", "b", "a"), [True, True, True]) == [1, 2, 3]


def test_a_rejected_row_holds_back_the_later_rows_of_its_pipeline_only():
    batch = rows("a", "b", "a", "b", "c")
    assert relay.publishable(batch, [False, True, True, True, True]) == [2, 4, 5]


def test_earlier_rows_of_a_pipeline_stay_published_when_a_later_one_fails():
    assert relay.publishable(rows("a", "a", "a"), [True, False, True]) == [1]
