"""The Helm charts' side of each service's settings: the `settings:` block of values.yaml and
values.schema.json, both written from the service's settings class, so that every setting a
service reads is reachable from its chart's values and a wrong value fails at install time.

`castad-admin charts` rewrites them; tests/deploy checks that the committed files match.
"""

from __future__ import annotations

import json
import pathlib
import typing
from typing import Any

import yaml
from castad_api import settings as api_settings
from castad_contracts import topology
from castad_lyric import service as lyric
from castad_relay import settings as relay_settings
from castad_runtime import settings
from castad_song import service as song
from castad_video import service as video
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from castad_local import REPO_ROOT

CHARTS = REPO_ROOT / "infra" / "helm"
SETTINGS: dict[str, type[BaseSettings]] = {
    "api": api_settings.ApiSettings,
    "relay": relay_settings.RelaySettings,
    "lyric": lyric.LyricSettings,
    "song": song.SongSettings,
    "video": video.VideoSettings,
}
BEGIN = "# settings:begin (written by `castad-admin charts` from the service's settings; edit values, not keys)"
END = "# settings:end"


def from_structure(service: str) -> dict[str, str]:
    """Variables the chart sets from its structure (Secrets, ports, volume), not from `settings`."""
    upper = service.upper()
    owned = {"CASTAD_AMQP_URL": "broker.existingSecret"}
    if service == "api":
        owned |= {
            "CASTAD_API_HOST": "0.0.0.0",
            "CASTAD_API_PORT": "containerPort",
            "CASTAD_API_HEALTH_PORT": "probesPort",
        }
    else:
        owned[f"CASTAD_{upper}_HEALTH_PORT"] = "containerPort"
    if service == "relay":
        owned["CASTAD_RELAY_SOURCES"] = "sources[].existingSecret"
    else:
        owned[f"CASTAD_{upper}_DATABASE_URL"] = "database.existingSecret"
        owned["CASTAD_ARTIFACTS_DIR"] = "artifacts.mountPath"
        owned["CASTAD_ARTIFACTS_STORE"] = "artifacts.store"
    return owned


def variables(service: str) -> dict[str, dict[str, Any]]:
    """Every variable the service reads -> the JSON Schema of its value (with default and description)."""
    cls = SETTINGS[service]
    whole = cls.model_json_schema()
    properties, defined = whole["properties"], whole.get("$defs", {})
    result = {}
    for name, field in cls.model_fields.items():
        alias = field.validation_alias
        key = str(alias.choices[0]) if alias is not None and hasattr(alias, "choices") else name
        schema = {k: v for k, v in _inlined(properties[key], defined).items() if k not in ("title", "format")}
        result[settings.env_var(cls, name)] = schema
    return result


def _inlined(schema: Any, defined: dict[str, Any]) -> Any:
    """`schema` with each reference to one of its `$defs` replaced by what it refers to (a value's own file)."""
    if isinstance(schema, list):
        return [_inlined(item, defined) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if isinstance(ref := schema.get("$ref"), str) and ref.startswith("#/$defs/"):
        return _inlined(defined[ref.removeprefix("#/$defs/")], defined)
    return {key: _inlined(value, defined) for key, value in schema.items()}


def secret_settings(service: str) -> list[str]:
    """Variables holding a secret (a provider's key): a chart takes them from existing Secrets only."""
    cls = SETTINGS[service]
    return [
        settings.env_var(cls, name)
        for name, field in cls.model_fields.items()
        if field.annotation is SecretStr or SecretStr in typing.get_args(field.annotation)
    ]


def chart_settings(service: str) -> dict[str, dict[str, Any]]:
    skipped = set(from_structure(service)) | set(secret_settings(service))
    return {name: schema for name, schema in variables(service).items() if name not in skipped}


def settings_block(service: str) -> str:
    lines = [BEGIN, "settings:"]
    for name, schema in chart_settings(service).items():
        if schema.get("description"):
            lines.append(f"  # {schema['description']}")
        lines.append(f"  {name}: {json.dumps(schema.get('default'), ensure_ascii=False)}")
    secrets = secret_settings(service)
    lines.append("# Settings that are secrets, each from an existing Secret: {existingSecret: name, key: key}.")
    lines.append(f"# Any of: {', '.join(secrets)}." if secrets else "# This service has none.")
    lines.append("secretSettings: {}")
    lines.append(END)
    return "\n".join(lines)


def values_yaml(service: str) -> str:
    """The chart's values.yaml with its settings block written anew."""
    path = CHARTS / service / "values.yaml"
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + settings_block(service) + text[end:]


SCHEMA = pathlib.Path(__file__).with_name("values.schema.yaml")  # what no setting decides, in layers
LAYERS = {"every": topology.SERVICES, "with-database": topology.WITH_DATABASE, "stages": topology.STAGES}
COMMON_SETTINGS = (
    "CASTAD_NAMESPACE",
    "CASTAD_LOG_LEVEL",
    "CASTAD_HOLD_EVENTS_S",
    "CASTAD_HANDLER_RETRIES",
    # Retention the services must agree on: the gateway refuses what the stages' deletions make impossible.
    "CASTAD_RETENTION_INTERVAL_S",
    "CASTAD_RETENTION_BATCH",
    "CASTAD_RETENTION_PAUSE_S",
    "CASTAD_RETENTION_OUTBOX_S",
    "CASTAD_RETENTION_INBOX_S",
    "CASTAD_RETENTION_JOBS_S",
    "CASTAD_RETENTION_ARTIFACTS_S",
)


def values_schema(service: str) -> dict[str, Any]:
    """The chart's values.schema.json: every key typed, none other allowed, one property per setting.

    SCHEMA's layers for the service, merged in order, and what the service's settings and the topology decide.
    """
    written = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {}, "required": []}
    for layer in written["layers"]:
        if layer["for"] not in {*LAYERS, *topology.SERVICES}:
            raise ValueError(f"{SCHEMA.name}: a layer is for {layer['for']!r}, none of {[*LAYERS, *topology.SERVICES]}")
        if service in LAYERS.get(layer["for"], (layer["for"],)):
            _merge(schema, {key: value for key, value in layer.items() if key != "for"})
    properties = schema["properties"]
    settings_ = chart_settings(service)
    properties["component"] = {"const": service}
    properties["global"]["properties"]["settings"] = _object(
        {name: _without_default(settings_[name]) for name in COMMON_SETTINGS}
    )
    properties["settings"] = {
        **_object({name: _without_default(value) for name, value in settings_.items()}),
        "description": "every CASTAD_* setting of the service that its chart does not set itself",
    }
    properties["secretSettings"] = {
        **_object({name: {"$ref": "#/definitions/secret"} for name in secret_settings(service)}),
        "description": "settings that are secrets (a provider's key), each from an existing Secret",
    }
    if service == "relay":
        properties["sources"]["items"]["properties"]["name"]["enum"] = list(topology.WITH_DATABASE)
    elif service in topology.STAGES:
        others = [stage for stage in topology.STAGES if stage != service]
        properties["artifacts"]["properties"]["reads"]["items"]["enum"] = [*others, "images"]
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": f"castad-{service} chart values",
        **schema,
        "definitions": written["definitions"],
    }


def _merge(into: dict[str, Any], layer: dict[str, Any]) -> None:
    """Merge `layer` into `into`: objects key by key, lists joined, anything else replaced."""
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = [*into[key], *value]
        else:
            into[key] = value


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": []}


def _without_default(schema: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key != "default"}


def write() -> list[pathlib.Path]:
    written = []
    for service in SETTINGS:
        values = CHARTS / service / "values.yaml"
        values.write_text(values_yaml(service), encoding="utf-8")
        schema = CHARTS / service / "values.schema.json"
        schema.write_text(json.dumps(values_schema(service), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written += [values, schema]
    return written
