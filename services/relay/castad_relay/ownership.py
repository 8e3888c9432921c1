"""What a service's outbox may publish: the relay's look at every row before it sends it.

Whoever can write a service's database can write any row into its outbox. The relay knows whose
database it reads (its `sources` setting names each one's service) and publishes from it only:
- to the events exchange, that service's own event types (`topology.PRODUCERS`), each written with
  that service's source (`topology.SOURCES`) and routed by its own type;
- to one queue (`destination`), only from the gateway's outbox: a dead letter the gateway sends back
  to the queue it came from. Such an event keeps the source of the service that produced it (which is
  how its consumer still takes it): the gateway vouches for it, as the only service that records dead
  letters (from the broker's word of where each came from) and replays them.

A row refused here is parked at once with the reason (trying again would change nothing): the operators
see it among the dead letters, and it holds back only the later rows of its own pipeline. When a release
adds an event type, the relay is upgraded before its producer, or the producer's first such rows are
parked (to be republished once the relay knows the type).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from castad_contracts import topology


def refusal(service: str, row: Mapping[str, Any], topo: topology.Topology) -> str | None:
    """Why `service`'s outbox may not publish `row`; None if it may.

    `row` is an outbox row taken apart (`publisher.taken_apart`): its envelope's `event_type` and `event_source`
    are those it publishes.
    """
    event_type, source, destination = row["event_type"], row["event_source"], row["destination"]
    if event_type is None or source is None:
        return "its envelope is no JSON object with a type and a source"
    if event_type != row["routing_key"]:
        return f"routing key {row['routing_key']} is not its event's type {event_type!r}"
    producer = topology.PRODUCERS.get(event_type)
    if producer is None:
        return f"{event_type!r} is no event type of any service"
    if destination is not None:
        if service != topology.GATEWAY:
            return f"only the gateway's outbox addresses a queue, not {service}'s (to {destination})"
        if destination not in {topo.queue(each) for each in topo.services}:
            return f"{destination} is no service's queue"
        if source != topology.SOURCES[producer]:
            return f"replayed {event_type} has source {source!r}, not its producer's {topology.SOURCES[producer]}"
        return None
    if producer != service:
        return f"{event_type} is {producer}'s, not {service}'s to publish"
    if source != topology.SOURCES[service]:
        return f"{event_type} written with source {source!r}, not {topology.SOURCES[service]}"
    return None
