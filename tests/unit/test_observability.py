"""The alert rules, the scrape configs and the Grafana dashboard of infra/observability.

Every rule is complete, every query parses as PromQL, and every metric and label a query names is one the services
really expose, as their own registries list them (built as each composition root builds them, with servers that are
not there: a scrape-time reading that fails still names its families).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import promql_parser
import pytest
import yaml
from castad_api import metrics as api_metrics
from castad_contracts import topology
from castad_local import REPO_ROOT, stack
from castad_lyric import service as lyric
from castad_relay import metrics as relay_metrics
from castad_runtime.stage import service as stage_service
from prometheus_client import CollectorRegistry

OBSERVABILITY = REPO_ROOT / "infra" / "observability"
NOWHERE_DB = "postgresql+psycopg://castad@127.0.0.1:1/nowhere"  # refused at once: nothing listens on port 1
NOWHERE_AMQP = "amqp://guest:guest@127.0.0.1:1/%2F"
# Series Prometheus records itself for every target, and the labels it gives every series of a target.
PROMETHEUS_OWN = {"up": frozenset()}
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "le"})
# Grafana's own variables, as Grafana replaces them before a query goes to Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
}


def exposed(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    """Sample name -> label names of every metric a registry serves, whether it has samples yet or not.

    prometheus_client keeps a registry's collectors and a metric's label names to itself; they are read
    here so that the labels of a metric with no sample yet are known too."""
    names: dict[str, frozenset[str]] = {}
    families = set()
    for collector in list(registry._collector_to_names):
        for family in collector.describe():
            families.add(family.name)
            labels = getattr(family, "_labelnames", None) or getattr(collector, "_labelnames", ())
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = frozenset(labels)
    assert {family.name for family in registry.collect()} == families, "a scrape answers every family"
    return names


@pytest.fixture(scope="module")
def metrics() -> dict[str, frozenset[str]]:
    """Every metric of every service, from the registries their composition roots build.

    A scrape of them with no server there answers with every family all the same.
    """
    topo = topology.Topology("castad")
    stage_config = lyric.LyricSettings(database_url=NOWHERE_DB, amqp_url=NOWHERE_AMQP)
    registries = [
        api_metrics.instruments(NOWHERE_DB, NOWHERE_AMQP, topo).registry,
        relay_metrics.instruments({"lyric": NOWHERE_DB.replace("+psycopg", "")}).registry,
        stage_service.instruments("lyric", stage_config, topo).registry,
    ]
    found: dict[str, frozenset[str]] = dict(PROMETHEUS_OWN)
    for registry in registries:
        found.update(exposed(registry))
    return found


def rules() -> list[dict]:
    document = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_queries() -> Iterator[tuple[str, str]]:
    dashboard = json.loads((OBSERVABILITY / "castad.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it is matched or grouped on) of every selector in a PromQL expression."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    found: list[tuple[str, set[str]]] = []
    grouped: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouped.update(node.modifier.labels)
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, {matcher.name for matcher in node.matchers.matchers}))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return [(name, labels | grouped) for name, labels in found]


def test_every_alert_rule_has_its_expression_a_duration_a_severity_and_what_to_tell():
    found = rules()
    assert len(found) >= 6
    for rule in found:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule.get("alert")
        assert rule["alert"].startswith("Castad"), rule["alert"]
        assert rule["for"][-1] in "smh" and int(rule["for"][:-1]) > 0, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    names = {rule["alert"] for rule in found}
    assert len(names) == len(found), "alert names repeat"


def test_the_rules_cover_relay_lag_backlog_stuck_jobs_failures_dead_letters_and_a_service_down():
    used = {name for rule in rules() for name, _ in selectors(rule["expr"])}
    for metric in (
        "castad_outbox_oldest_unpublished_age_seconds",
        "castad_outbox_backlog",
        "castad_jobs_lease_expired",
        "castad_attempts_total",
        "castad_consumer_dead_letters_total",
        "castad_queue_messages",
        "castad_relay_publish_failures_total",
        "up",
    ):
        assert metric in used, metric


def test_the_queue_alert_fires_at_four_fifths_of_the_queues_limit():
    [filling] = [rule for rule in rules() if rule["alert"] == "CastadQueueFilling"]
    assert filling["expr"].endswith(f"> {topology.QUEUE_MAX_MESSAGES * 4 // 5}")
    assert topology.Topology().limits_policy().definition["max-length"] == topology.QUEUE_MAX_MESSAGES


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_query_parses_and_names_only_metrics_and_labels_a_service_exposes(source, metrics):
    queries = [(rule["alert"], rule["expr"]) for rule in rules()] if source == "rules" else list(dashboard_queries())
    assert queries
    for where, expr in queries:
        for name, labels in selectors(expr):
            assert name in metrics, f"{where}: {name} is exposed by no service"
            unknown = labels - metrics[name] - TARGET_LABELS
            assert not unknown, f"{where}: {name} has no label {sorted(unknown)}"


def test_a_query_naming_a_metric_no_service_exposes_is_caught(metrics):
    """The check above can fail: a misspelt name and a label a metric lacks are both found."""
    [(name, labels)] = selectors('sum by (stage) (rate(castad_atempts_total{reason="x"}[5m]))')
    assert name not in metrics
    [(name, labels)] = selectors('sum by (source) (rate(castad_attempts_total{reason="x"}[5m]))')
    assert labels - metrics[name] - TARGET_LABELS == {"reason", "source"}


def test_the_dashboard_shows_throughput_latency_outcomes_backlog_queues_jobs_dead_letters_and_quota():
    used = {name for _, expr in dashboard_queries() for name, _ in selectors(expr)}
    for metric in (
        "castad_relay_published_total",
        "castad_handoff_seconds_bucket",
        "castad_attempts_total",
        "castad_outbox_backlog",
        "castad_queue_messages",
        "castad_jobs",
        "castad_consumer_dead_letters_total",
        "castad_dead_letters",
        "castad_quota_waits_total",
    ):
        assert metric in used, metric
    dashboard = json.loads((OBSERVABILITY / "castad.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_the_scrape_configs_load_the_rules_and_find_every_service():
    local = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    assert all((OBSERVABILITY / name).exists() for name in local["rule_files"])
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in local["scrape_configs"]}
    ports = stack.PROBE_PORTS  # in castad.env: the gateway's apart from its public port, as in the charts
    assert targets == {f"castad-{service}": [f"127.0.0.1:{port}"] for service, port in ports.items()}
    cluster = yaml.safe_load((OBSERVABILITY / "prometheus-kubernetes.yml").read_text())
    assert cluster["rule_files"] == local["rule_files"]
    relabels = cluster["scrape_configs"][0]["relabel_configs"]
    assert {"target_label": "job", "replacement": "castad-$1"}.items() <= next(
        r for r in relabels if r.get("target_label") == "job"
    ).items()
