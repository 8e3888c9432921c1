"""Where events flow: one topic exchange, one durable queue per consuming service.

Each consuming service owns its queue and the routing keys it binds; the relay
publishes every event to the exchange with its type as routing key. A namespace
prefixes every name so that tests and several installations can share a broker.
"""

from __future__ import annotations

import dataclasses

from castad_contracts import events

DEFAULT_NAMESPACE = "castad"


@dataclasses.dataclass(frozen=True)
class Subscription:
    service: str
    routing_keys: tuple[str, ...]


def _all_stage_facts() -> tuple[str, ...]:
    return tuple(f"{stage.value}.*" for stage in events.Stage)


SUBSCRIPTIONS: dict[str, Subscription] = {
    "api": Subscription("api", _all_stage_facts()),
    **{
        stage.value: Subscription(stage.value, (trigger, events.provider_called_back(stage), *events.OPERATOR_REQUESTS))
        for stage, trigger in (
            (events.Stage.LYRIC, events.PIPELINE_REQUESTED),
            (events.Stage.SONG, events.stage_event(events.Stage.LYRIC, "completed")),
            (events.Stage.VIDEO, events.stage_event(events.Stage.SONG, "completed")),
        )
    },
}


@dataclasses.dataclass(frozen=True)
class Topology:
    namespace: str = DEFAULT_NAMESPACE

    @property
    def exchange(self) -> str:
        return f"{self.namespace}.events"

    @property
    def dead_letter_queue(self) -> str:
        """Messages no consumer could parse or route, with the reason in their headers."""
        return f"{self.namespace}.dead-letter"

    def queue(self, service: str) -> str:
        return f"{self.namespace}.{service}"

    def bindings(self, service: str) -> tuple[str, ...]:
        return SUBSCRIPTIONS[service].routing_keys

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(SUBSCRIPTIONS)
