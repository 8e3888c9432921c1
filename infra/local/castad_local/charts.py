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


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(required)}


STRING = {"type": "string"}
NAME = {"type": "string", "minLength": 1}
BOOLEAN = {"type": "boolean"}
FREE = {"type": "object"}
LIST = {"type": "array"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"}
SECRET = _object({"existingSecret": NAME, "key": NAME}, ("existingSecret", "key"))
RESOURCES = _object(
    {
        kind: {"type": "object", "additionalProperties": False, "properties": {"cpu": {}, "memory": {}}}
        for kind in ("requests", "limits")
    }
)
WHEN_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
# NetworkPolicy's parts, written once in each schema's `definitions` and referred to from where they are used.
CIDR = {
    "type": "string",
    "pattern": r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$|^[0-9a-fA-F:]*:[0-9a-fA-F:]*/[0-9]{1,3}$",
}
LABEL_SELECTOR = {"$ref": "#/definitions/labelSelector"}
DESTINATIONS = {"$ref": "#/definitions/destinations"}
PORTS = {"$ref": "#/definitions/ports"}
TARGET = {"$ref": "#/definitions/target"}  # an egress rule: peers and ports
DEFINITIONS = {
    "labelSelector": _object(
        {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}, "matchExpressions": LIST}
    ),
    "peer": {
        **_object(
            {
                "podSelector": LABEL_SELECTOR,
                "namespaceSelector": LABEL_SELECTOR,
                "ipBlock": _object({"cidr": CIDR, "except": {"type": "array", "items": CIDR}}, ("cidr",)),
            }
        ),
        "minProperties": 1,
    },
    # an egress rule with no peer would reach everything on its ports
    "destinations": {"type": "array", "items": {"$ref": "#/definitions/peer"}, "minItems": 1},
    "ports": {"type": "array", "items": PORT, "minItems": 1},
    "target": _object({"to": DESTINATIONS, "ports": PORTS}, ("to", "ports")),
}


def _peers(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"$ref": "#/definitions/peer"}, "description": description}


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


def network_policy_schema(service: str) -> dict[str, Any]:
    """`networkPolicy`: where the service's pods take connections from and what they reach (castad-common's
    _network.tpl): the same for every service, with the gateway's webhooks, a stage's provider and the video
    stage's photo hosts besides."""
    properties: dict[str, Any] = {
        "enabled": BOOLEAN,
        "metricsFrom": _peers("who reaches the probes port's /metrics (empty: anyone)"),
        "dns": TARGET,
        "postgresql": TARGET,
        "rabbitmq": TARGET,
        "otel": _object({"to": DESTINATIONS}, ("to",)),
        "extraEgress": {
            "type": "array",
            "items": {"type": "object"},
            "description": "NetworkPolicy egress rules rendered as written",
        },
    }
    required = ["enabled", "dns", "postgresql", "rabbitmq", "otel"]
    if service == "api":
        properties["apiFrom"] = _peers("who reaches the API port (empty: anyone)")
        properties["webhooks"] = TARGET
        required.append("webhooks")
    elif service != "relay":
        properties["provider"] = TARGET
        required.append("provider")
    if service == "video":
        properties["photos"] = TARGET
        required.append("photos")
    if service != "relay":
        properties["objectStore"] = TARGET
        required.append("objectStore")
    return _object(properties, tuple(required))


def values_schema(service: str) -> dict[str, Any]:
    """The chart's values.schema.json: every key typed, none other allowed, one property per setting."""
    settings_ = chart_settings(service)
    properties: dict[str, Any] = {
        "component": {"const": service},
        "enabled": {"type": "boolean", "description": "the umbrella chart's switch for this service"},
        "fullnameOverride": STRING,
        "castad-common": {"type": "object", "description": "the library chart's (empty) values, added by Helm"},
        "image": _object(
            {
                "registry": NAME,
                "repository": NAME,
                "tag": {"type": "string", "description": "empty: the chart's appVersion"},
                "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
            },
            ("registry", "repository", "pullPolicy"),
        ),
        "imagePullSecrets": {"type": "array", "items": _object({"name": NAME}, ("name",))},
        "replicaCount": {"type": "integer", "minimum": 1 if service == "relay" else 0},
        "containerPort": PORT,
        "portName": {"type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$"},
        "broker": SECRET,
        "otel": _object({"endpoint": {"type": "string", "pattern": "^(https?://.+)?$"}}),
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 1},
        "resources": RESOURCES,
        "podSecurityContext": FREE,
        "securityContext": FREE,
        "tmpSizeLimit": QUANTITY,
        "serviceAccount": _object({"create": BOOLEAN, "name": STRING, "annotations": FREE}, ("create",)),
        "podDisruptionBudget": _object(
            {"enabled": BOOLEAN, "maxUnavailable": {"type": ["integer", "string"], "pattern": "^[0-9]+%$"}},
            ("enabled", "maxUnavailable"),
        ),
        "metrics": _object(
            {
                "scrape": {"type": "boolean", "description": "annotate the pods prometheus.io/scrape, /port, /path"},
                "podMonitor": _object(
                    {
                        "enabled": BOOLEAN,
                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        "labels": FREE,
                    },
                    ("enabled", "interval"),
                ),
            },
            ("scrape", "podMonitor"),
        ),
        "podAnnotations": FREE,
        "nodeSelector": FREE,
        "tolerations": LIST,
        "affinity": FREE,
        "spread": {
            **_object(
                {
                    "enabled": {"type": "boolean", "description": "false: the chart adds no spread constraint"},
                    "nodes": {
                        "enum": list(WHEN_UNSATISFIABLE),
                        "description": "DoNotSchedule: never two replicas on one node (a replica waits for a node);"
                        " ScheduleAnyway: replicas share nodes when there are too few",
                    },
                    "zones": {
                        "enum": list(WHEN_UNSATISFIABLE),
                        "description": "ScheduleAnyway: spread over zones where the cluster has them; DoNotSchedule:"
                        " a replica waits rather than unbalance the zones",
                    },
                },
                ("enabled", "nodes", "zones"),
            ),
            "description": "replicas over nodes (kubernetes.io/hostname) and zones (topology.kubernetes.io/zone)",
        },
        "topologySpreadConstraints": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["maxSkew", "topologyKey", "whenUnsatisfiable"],
                "properties": {"whenUnsatisfiable": {"enum": list(WHEN_UNSATISFIABLE)}},
            },
            "description": "constraints of your own in place of `spread`; one without a labelSelector counts this"
            " service's replicas",
        },
        "global": {
            "type": "object",
            "description": "values the umbrella chart gives every service",
            "properties": {
                "imageRegistry": STRING,
                "otel": _object({"endpoint": {"type": "string", "pattern": "^(https?://.+)?$"}}),
                "artifacts": _object({"claimName": NAME}),
                "settings": _object({name: _without_default(settings_[name]) for name in COMMON_SETTINGS}),
                "networkPolicy": _object(
                    {
                        "enabled": BOOLEAN,
                        "metricsFrom": _peers("who reaches the probes port's /metrics (empty: anyone)"),
                        **{
                            name: _object({"to": DESTINATIONS, "ports": PORTS})
                            for name in ("dns", "postgresql", "rabbitmq")
                        },
                        "otel": _object({"to": DESTINATIONS}),
                    }
                ),
            },
        },
        "networkPolicy": network_policy_schema(service),
        "settings": {
            **_object({name: _without_default(schema) for name, schema in settings_.items()}),
            "description": "every CASTAD_* setting of the service that its chart does not set itself",
        },
        "secretSettings": {
            **_object({name: SECRET for name in secret_settings(service)}),
            "description": "settings that are secrets (a provider's key), each from an existing Secret",
        },
    }
    required = [
        "component",
        "image",
        "replicaCount",
        "containerPort",
        "portName",
        "broker",
        "metrics",
        "networkPolicy",
        "settings",
    ]
    if service == "relay":
        source = _object(
            {"name": {"enum": list(topology.WITH_DATABASE)}, "existingSecret": NAME, "key": NAME},
            ("name", "existingSecret", "key"),
        )
        properties["sources"] = {"type": "array", "minItems": 1, "items": source}
        required.append("sources")
    else:
        properties["database"] = SECRET
        properties["artifacts"] = _object(
            {
                "store": {
                    "enum": ["volume", "s3"],
                    "description": "volume: a shared ReadWriteMany volume; s3: a bucket (settings"
                    " CASTAD_ARTIFACTS_S3_*; see docs/deploy.md)",
                },
                "claimName": NAME,
                "mountPath": {"type": "string", "pattern": "^/"},
                "scratchSizeLimit": QUANTITY,
                "credentialsSecret": {
                    "type": "string",
                    "description": "s3: a Secret whose keys become the environment (AWS_ACCESS_KEY_ID,"
                    " AWS_SECRET_ACCESS_KEY); empty: the pod's own identity",
                },
            },
            ("store", "claimName", "mountPath"),
        )
        if service != "api":
            properties["artifacts"]["properties"] |= {
                "reads": {
                    "type": "array",
                    "uniqueItems": True,
                    "items": {"enum": [*(s for s in topology.STAGES if s != service), "images"]},
                    "description": "volume: the places of the volume this stage reads, mounted read-only",
                },
                "wholeVolume": {
                    "type": "boolean",
                    "description": "volume: mount the whole volume read-write, as releases up to 0.2 did; for a"
                    " volume that still holds their files, until `relayout` has moved them (CHANGELOG)",
                },
            }
        properties["migrations"] = _object(
            {
                "enabled": BOOLEAN,
                "backoffLimit": {"type": "integer", "minimum": 0},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "resources": RESOURCES,
            },
            ("enabled",),
        )
        properties["topology"] = _object(
            {
                "enabled": BOOLEAN,
                "existingSecret": {
                    "type": "string",
                    "description": "a Secret holding the AMQP URL of a broker user that may configure the vhost",
                },
                "key": NAME,
                "backoffLimit": {"type": "integer", "minimum": 0},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
            },
            ("enabled",),
        )
        properties["autoscaling"] = _object(
            {
                "enabled": BOOLEAN,
                "minReplicas": {"type": "integer", "minimum": 1},
                "maxReplicas": {"type": "integer", "minimum": 1},
                "targetCPUUtilizationPercentage": {"type": "integer", "minimum": 1, "maximum": 100},
            },
            ("enabled",),
        )
        required += ["database", "artifacts"]
    if service == "api":
        properties["service"] = _object(
            {"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}, "port": PORT}, ("type", "port")
        )
        properties["probesPort"] = {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 65535,
            "description": "the port of /healthz, /readyz and /metrics (CASTAD_API_HEALTH_PORT); null: the API's",
        }
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": f"castad-{service} chart values",
        **_object(properties, tuple(required)),
        "definitions": DEFINITIONS,
    }


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
