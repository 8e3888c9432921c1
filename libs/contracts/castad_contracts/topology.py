"""Where events flow: one topic exchange, one durable queue per consuming service.

Each consuming service owns its queue and the routing keys it binds; the relay
publishes every event to the exchange with its type as routing key. A namespace
prefixes every name so that tests and several installations can share a broker.

An event reaches only the queues bound to its type when it is published: so before it publishes
a type, the relay binds it to every queue that takes it (`subscribers`), and holds the event
while one of those queues does not exist yet. A service that starts after its producers, or a
chart installed later, misses nothing.

Nothing is published through the default exchange, which reaches every queue by name: a
service's own re-deliveries (a delayed retry, a replayed dead letter) go through its requeue
exchange, bound to its own queues only. A consumer files a dead letter by rejecting it on its
own queue, which dead-letters it into the dead-letter exchange with the broker's `x-death`
naming that queue; only the relay (notices of parked rows) and the gateway publish into that
exchange themselves. So each service's broker user can be limited to its own names
(`permissions`), and a dead letter cannot claim another queue to be replayed into.

Who may say what (`PRODUCERS`, `SOURCES`): each event type has one producing service, which
writes it with its own envelope `source`. The relay publishes from a service's outbox only that
service's own types, and only the gateway's outbox may address one queue (a replayed dead letter,
which keeps the `source` of the service that first produced it); a consumer takes an event only
if its `source` is its type's producer's.

Every queue is a quorum queue: replicated over a majority of a cluster's nodes, its publishes
confirmed once a majority wrote them. A message its consumers take and never acknowledge (it
kills or stops them every time) goes to the dead-letter exchange after `DELIVERY_LIMIT` returns,
at least once, instead of coming back for ever.
"""

from __future__ import annotations

import dataclasses
import json
import re

from castad_contracts import events

DEFAULT_NAMESPACE = "castad"
QUEUE_TYPE = "quorum"
# Returns of one message to its queue (a consumer stopped, died or gave it back) before it is dead-lettered.
# A stop or a crash returns every message its consumer held, so the limit is well above what deploys and
# crashes of healthy consumers give one message.
DELIVERY_LIMIT = 20
# Messages a service's queue, or the dead-letter queue, holds at most (a policy, `limits_policy`). A full queue
# refuses more (reject-publish): the broker nacks a publish routed to it, and the relay holds that routing key's
# rows in their outboxes, on disk, until the queue has room. Without a limit a stalled consumer grows its queue
# until the broker's memory or disk alarm blocks every publisher of the cluster.
QUEUE_MAX_MESSAGES = 100_000


@dataclasses.dataclass(frozen=True)
class Subscription:
    service: str
    routing_keys: tuple[str, ...]


def _all_stage_facts() -> tuple[str, ...]:
    return tuple(f"{stage.value}.*" for stage in events.Stage)


SUBSCRIPTIONS: dict[str, Subscription] = {
    "api": Subscription("api", _all_stage_facts()),
    **{
        stage.value: Subscription(
            stage.value,
            (
                trigger,
                events.provider_called_back(stage),
                *events.OPERATOR_REQUESTS,
                *((events.PIPELINE_REVIEW_DECIDED,) if stage in events.DRAFTED else ()),
            ),
        )
        for stage, trigger in events.TRIGGERS.items()
    },
}


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic exchange routes `routing_key` along a binding of `pattern` (`*` one word, `#` any words)."""

    def match(words: list[str], keys: list[str]) -> bool:
        if not words:
            return not keys
        if words[0] == "#":
            return any(match(words[1:], keys[skip:]) for skip in range(len(keys) + 1))
        return bool(keys) and words[0] in ("*", keys[0]) and match(words[1:], keys[1:])

    return match(pattern.split("."), routing_key.split("."))


def subscribers(routing_key: str) -> dict[str, tuple[str, ...]]:
    """Each service whose queue takes events of `routing_key`, with those of its bindings that route them."""
    found = {
        service: tuple(key for key in subscription.routing_keys if topic_matches(key, routing_key))
        for service, subscription in SUBSCRIPTIONS.items()
    }
    return {service: keys for service, keys in found.items() if keys}


def routed(service: str, registry: events.Registry = events.REGISTRY) -> frozenset[str]:
    """Every event type the contracts know that `service`'s queue takes: what its consumer must handle."""
    return frozenset(event_type for event_type in registry.event_types if service in subscribers(event_type))


GATEWAY = "api"  # the only service whose outbox may address one queue (a replayed dead letter)
RELAY = "relay"  # the broker user that publishes and consumes nothing
SHARED_OWNER = GATEWAY  # declares the events exchange and the dead letters' exchange and queue
# Castad's services by name, in the saga's order: what tests, benchmarks and tooling iterate over.
STAGES = tuple(stage.value for stage in events.Stage)
WITH_DATABASE = (GATEWAY, *STAGES)  # each with a database (and an outbox) of its own
SERVICES = (GATEWAY, RELAY, *STAGES)
WORKERS = (RELAY, *STAGES)  # serving no API: their probes and metrics on a port of their own

# The service that produces each event type: the only one whose outbox the relay publishes it from.
PRODUCERS: dict[str, str] = {
    events.PIPELINE_REQUESTED: GATEWAY,
    **{request: GATEWAY for request in (*events.OPERATOR_REQUESTS, events.PIPELINE_REVIEW_DECIDED)},
    **{events.provider_called_back(stage): GATEWAY for stage in events.Stage},
    **{events.stage_event(stage, fact): stage.value for stage in events.Stage for fact in events.stage_facts(stage)},
}
# The envelope `source` each producing service writes (and every consumer expects of its types).
SOURCES: dict[str, str] = {service: f"/castad/{service}" for service in dict.fromkeys(PRODUCERS.values())}


@dataclasses.dataclass(frozen=True)
class Permissions:
    """A RabbitMQ user's configure, write and read patterns on the vhost."""

    configure: str
    write: str
    read: str


@dataclasses.dataclass(frozen=True)
class TopicPermissions:
    """A RabbitMQ user's routing keys on one topic exchange: those it may publish with, and those it may bind with."""

    exchange: str
    write: str
    read: str


@dataclasses.dataclass(frozen=True)
class Policy:
    """A RabbitMQ policy: a definition applied to the queues whose names match a pattern.

    Set with `rabbitmqctl set_policy` (set-up does), or the management API, or a RabbitMQ operator's Policy
    resource; a queue takes the one matching policy of the highest priority.
    """

    name: str
    pattern: str
    definition: dict[str, str | int]
    apply_to: str = "queues"

    def command(self, vhost: str) -> list[str]:
        """The `rabbitmqctl` arguments that set it on `vhost`."""
        return [
            "set_policy",
            "-p",
            vhost,
            "--apply-to",
            self.apply_to,
            self.name,
            self.pattern,
            json.dumps(self.definition, sort_keys=True),
        ]


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

    @property
    def dead_letter_exchange(self) -> str:
        """A fanout exchange into the dead-letter queue (the same name; exchanges and queues are apart)."""
        return self.dead_letter_queue

    def queue(self, service: str) -> str:
        return f"{self.namespace}.{service}"

    def queue_arguments(self) -> dict[str, str | int]:
        """The arguments of a service's queue and of its delay queue."""
        return {
            "x-queue-type": QUEUE_TYPE,
            "x-delivery-limit": DELIVERY_LIMIT,
            "x-dead-letter-exchange": self.dead_letter_exchange,
            # Dead-lettered once the dead-letter queue confirmed it, which needs publishes refused (not dropped)
            # when a queue is full (its length limit is a policy, `limits_policy`).
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    def limits_policy(self, max_messages: int = QUEUE_MAX_MESSAGES) -> Policy:
        """The length limit of every service's queue and of the dead-letter queue (not of the delay queues).

        Over it a queue refuses a publish (reject-publish) rather than drop its oldest message: the relay's publish
        is nacked and waits, and a message dead-lettered into a full dead-letter queue stays in its own queue until
        there is room (`x-dead-letter-strategy` at-least-once)."""
        names = "|".join(re.escape(self.queue(service)) for service in self.services)
        return Policy(
            name=f"{self.namespace}-queue-limits",
            pattern=f"^({names}|{re.escape(self.dead_letter_queue)})$",
            definition={"max-length": max_messages, "overflow": "reject-publish"},
        )

    @staticmethod
    def dead_letter_queue_arguments(broker_major: int) -> dict[str, str | int]:
        """The arguments of the dead-letter queue on a RabbitMQ of this major version.

        No delivery limit, as it has nowhere further to send a message. RabbitMQ 4 gives every quorum queue a limit
        of 20 unless told -1; RabbitMQ 3 has none unless told one, and drops a message at its first return when
        told -1.
        """
        return {"x-queue-type": QUEUE_TYPE, **({"x-delivery-limit": -1} if broker_major >= 4 else {})}

    @staticmethod
    def requeue_exchange(queue: str) -> str:
        """A direct exchange bound to `queue` and its delay queue, each by its own name."""
        return f"{queue}.requeue"

    def permissions(self, user: str) -> Permissions:
        """The least a broker user needs.

        A consuming service (its queues, its requeue exchange, binding to the events exchange; the gateway also
        owns the shared exchanges and the dead-letter queue, and may publish dead letters) or the relay (publishing
        events, replays and notices of parked rows, and binding the consumers' queues to the events they take). A
        stage may not publish into the dead-letter exchange: it files a dead letter by rejecting it on its own queue.

        A queue is declared with its dead-letter exchange as an argument, which RabbitMQ lets only a
        user who may publish there declare anew (declaring it again as it is needs no such right): so a
        stage's queues are first declared by set-up (`castad-admin topology`), as an administrator."""
        ns = re.escape(self.namespace)
        if user == RELAY:
            # Writing a consumer's queue lets it bind that queue to the events exchange it reads (`queue.bind`), which
            # it does before it publishes what the queue must take (and unbind it, and bind the events exchange to
            # the exchanges it writes: nothing it could not do by publishing, or by not publishing). Publishing into
            # a queue by name needs the default exchange, which it may not write; reading, purging or deleting a
            # queue needs rights it has not.
            consumers = "|".join(map(re.escape, self.services))
            write = rf"^{ns}\.(events|dead-letter|({consumers})(\.requeue)?)$"
            return Permissions(configure="^$", write=write, read=rf"^{ns}\.events$")
        if user not in SUBSCRIPTIONS:
            raise ValueError(f"no broker user {user!r}: one of {', '.join((*SUBSCRIPTIONS, RELAY))}")
        own = rf"{ns}\.{re.escape(user)}(\.DQ|\.requeue)?"
        if user == SHARED_OWNER:
            shared = rf"{ns}\.(events|dead-letter)"
            write = rf"^({own}|{ns}\.dead-letter)$"  # publishing to its requeue and the dead-letter exchange
            return Permissions(configure=f"^({own}|{shared})$", write=write, read=f"^({own}|{shared})$")
        return Permissions(configure=f"^{own}$", write=f"^{own}$", read=rf"^({own}|{ns}\.events)$")

    def topic_permissions(self, user: str) -> TopicPermissions:
        """The routing keys a broker user may use on the events exchange.

        The relay publishes every event type and binds each consumer's queue to what it takes; a consuming service
        publishes none and binds its queue with its own subscription's keys alone (no `#`: it reads only the events
        it consumes)."""
        if user == RELAY:
            return TopicPermissions(self.exchange, ".*", ".*")
        keys = "|".join(map(re.escape, self.bindings(user)))
        return TopicPermissions(self.exchange, "^$", f"^({keys})$")

    def bindings(self, service: str) -> tuple[str, ...]:
        return SUBSCRIPTIONS[service].routing_keys

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(SUBSCRIPTIONS)
