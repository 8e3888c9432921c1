"""The registry of event types and schema versions, and how it reads an older version as the current one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from castad_contracts.events.common import Payload

Upcast = Callable[[dict[str, Any]], dict[str, Any]]
Needed = Callable[[Any], bool]


class SchemaError(LookupError):
    """An event this registry cannot read."""


class UnknownEventType(SchemaError):
    """No payload model is registered for this event type, or for this older version of it."""


class NewerSchemaVersion(SchemaError):
    """The event has a newer schema version than this registry knows: its producer was upgraded first."""


class Registry:
    """Event type and schema version -> payload model, and how to read every older version.

    The rule for a schema change (a rolling deploy may run old and new code side by side):
    the producer writes the newest version it knows; a consumer reads every version up to
    the newest it knows, upcasting older ones step by step to its current model, and raises
    NewerSchemaVersion for a version newer than that (its consumer holds such an event for
    a while, waiting for its own upgrade, rather than dead-lettering it). A version is never
    removed, so an event still in a queue or a dead-letter queue stays readable.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, int], type[Payload]] = {}
        self._upcasts: dict[tuple[str, int], Upcast] = {}
        self._needed: dict[tuple[str, int], Needed] = {}
        self._current: dict[str, int] = {}

    def register(
        self,
        event_type: str,
        version: int,
        model: type[Payload],
        upcast: Upcast | None = None,
        needed: Needed | None = None,
    ) -> None:
        """Add `version` of an event type; from version 2 on, `upcast` turns version-1 data into this version's.

        `needed`, for a version that changes what a value means rather than the shape: which payloads need this
        version though an older one could hold their data (a file in a new place), so that no producer writes them
        as that older version to a release that would misread them.
        """
        if version != self._current.get(event_type, 0) + 1:
            raise ValueError(f"{event_type}: version {version} does not follow {self._current.get(event_type, 0)}")
        if (version > 1) != (upcast is not None):
            raise ValueError(f"{event_type} v{version}: an upcast from the previous version is needed from v2 on")
        self._models[(event_type, version)] = model
        if upcast is not None:
            self._upcasts[(event_type, version)] = upcast
        if needed is not None:
            self._needed[(event_type, version)] = needed
        self._current[event_type] = version

    def copy(self) -> Registry:
        """An independent registry with the same entries (to add versions to, e.g. in a test)."""
        other = Registry()
        other._models, other._upcasts, other._current = dict(self._models), dict(self._upcasts), dict(self._current)
        other._needed = dict(self._needed)
        return other

    def until(self, event_type: str, version: int) -> Registry:
        """This registry as a release that knew `event_type` up to `version` only (and every other type as this)."""
        other = self.copy()
        for newer in range(version + 1, self.current_version(event_type) + 1):
            del other._models[(event_type, newer)], other._upcasts[(event_type, newer)]
            other._needed.pop((event_type, newer), None)
        other._current[event_type] = version
        return other

    def current_version(self, event_type: str) -> int:
        try:
            return self._current[event_type]
        except KeyError:
            raise UnknownEventType(f"no payload model for {event_type!r}") from None

    def model(self, event_type: str, version: int) -> type[Payload]:
        try:
            return self._models[(event_type, version)]
        except KeyError:
            raise UnknownEventType(f"no payload model for {event_type!r} version {version}") from None

    def read(self, event_type: str, version: int, data: dict[str, Any]) -> Payload:
        """The payload as the current model of its type, upcast from an older version if need be.

        Raises UnknownEventType, NewerSchemaVersion or pydantic.ValidationError.
        """
        current = self.current_version(event_type)
        if version > current:
            raise NewerSchemaVersion(f"{event_type} version {version} is newer than {current}, the newest known here")
        payload = self.model(event_type, version).model_validate(data)
        for step in range(version + 1, current + 1):
            upgraded = self._upcasts[(event_type, step)](payload.model_dump(mode="json"))
            payload = self._models[(event_type, step)].model_validate(upgraded)
        return payload

    def oldest_carrying(self, event_type: str, payload: Payload) -> tuple[int, dict[str, Any]]:
        """The oldest version of `event_type` that carries `payload` whole, and the payload's data in it.

        What a producer writes, and a stage stores as a job's input: a reader of an earlier release reads every
        event it can represent (a brief without photos, say, as a release before photos read it), and only one
        that needs a newer version waits for a reader of a newer release. Whole: read back through the upcasts, it
        is `payload` again; and never older than a version the payload is `needed` by (see `register`)."""
        current = self.current_version(event_type)
        data = payload.model_dump(mode="json")
        needing = [
            version for (kind, version), needed in self._needed.items() if kind == event_type and needed(payload)
        ]
        for version in range(max(needing, default=1), current):
            older = _projected(self.model(event_type, version), data)  # without what that version has not
            try:
                if self.read(event_type, version, older) == payload:
                    return version, older
            except ValidationError:
                continue  # a value this version does not allow
        return current, data

    def type_of(self, model: type[Payload]) -> str:
        """The event type whose current version `model` is."""
        for event_type, version in self._current.items():
            if self._models[(event_type, version)] is model:
                return event_type
        raise UnknownEventType(f"{model.__name__} is the current model of no event type")

    def items(self) -> list[tuple[tuple[str, int], type[Payload]]]:
        return sorted(self._models.items())

    @property
    def event_types(self) -> tuple[str, ...]:
        return tuple(sorted(self._current))


def _projected(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the fields `model` has not, its nested models' included.

    Whether they held anything that version cannot carry, the round trip through the upcasts tells
    (`Registry.oldest_carrying`)."""
    kept = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None:
            continue
        nested = field.annotation
        if isinstance(value, dict) and isinstance(nested, type) and issubclass(nested, BaseModel):
            value = _projected(nested, value)
        kept[name] = value
    return kept
