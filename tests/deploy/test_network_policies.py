"""Each service's pods take connections only from where they must, and reach only what they must.

Connections come only on their ports; they reach DNS, PostgreSQL, RabbitMQ, the trace collector, and a stage's
provider, the gateway's webhook receivers and the object store where the service uses one. No rendered rule reaches
a cloud's metadata address, whatever an operator gives.

`allowed` is NetworkPolicy's semantics as Kubernetes documents them, run over the rendered policies: a
pod that no policy of a direction selects is open that way; a pod that some do takes a connection when
a rule of one of them admits it, by its ports (none listed: every port) and its peers (none listed:
everyone). An ipBlock admits an address in its cidr and in none of its excepts; a podSelector or a
namespaceSelector admits pods only, never an address outside the cluster (a metadata server is one).
kubernetes-validate checks a manifest's shape only, so `check_ip_blocks` adds what the API server
refuses besides: an except that is not strictly inside its cidr.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from castad_contracts import topology
from castad_runtime import links

from tests.deploy.rendering import KUBERNETES_VERSIONS, by_kind, render

NAMESPACE = "media"  # the release's (rendering.render)

# Where cloud providers answer with a node's (or a pod's) credentials: AWS, GCP, Azure, OpenStack, Oracle,
# DigitalOcean at 169.254.169.254, ECS's task credentials and EKS Pod Identity in link-local as well,
# Alibaba at 100.100.100.200, and AWS's over IPv6.
METADATA = ("169.254.169.254", "169.254.170.2", "169.254.170.23", "100.100.100.200", "fd00:ec2::254", "fe80::1")
PORTS = (53, 80, 443, 4318, 5432, 5672, 8080)


@dataclasses.dataclass(frozen=True)
class Pod:
    labels: dict[str, str]
    namespace: str = NAMESPACE
    namespace_labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.namespace_labels.setdefault("kubernetes.io/metadata.name", self.namespace)


Endpoint = Pod | str  # a pod of the cluster, or an address outside it
DNS = Pod({"k8s-app": "kube-dns"}, "kube-system")
POSTGRES = Pod({"cnpg.io/cluster": "pg"}, "databases")
RABBITMQ = Pod({"app.kubernetes.io/name": "rabbitmq"}, "databases")
JAEGER = Pod({"app": "jaeger"})
PROMETHEUS = Pod({"app.kubernetes.io/name": "prometheus"}, "monitoring")
INTERNET = "203.0.113.10"  # a provider's API, a webhook receiver, a bucket
PRIVATE = "10.20.30.40"  # something in the cluster's network that is no pod


def network_values(service: str) -> dict[str, Any]:
    """Values under which the service reaches everything it can reach: a network provider, webhooks, a bucket."""
    upper = service.upper()
    values: dict[str, Any] = {"settings": {}, "secretSettings": {}}
    secret = {"existingSecret": "castad", "key": "k"}
    if service == "lyric":
        values["settings"]["CASTAD_LYRIC_PROVIDER"] = "openai"
        values["secretSettings"]["CASTAD_LYRIC_OPENAI_API_KEY"] = secret
    if service == "song":
        values["settings"]["CASTAD_SONG_PROVIDER"] = "suno"
        values["secretSettings"]["CASTAD_SONG_SUNO_API_KEY"] = secret
    if service == "video":
        values["settings"] |= {"CASTAD_VIDEO_PROVIDER": "creatomate", "CASTAD_VIDEO_CREATOMATE_TEMPLATE_ID": "t"}
        values["secretSettings"]["CASTAD_VIDEO_CREATOMATE_API_KEY"] = secret
    if service in links.SIGNERS:  # the stages that sign links for their provider
        values["settings"][f"CASTAD_{upper}_GATEWAY_URL"] = "https://castad.example.com"
        values["secretSettings"][f"CASTAD_{upper}_LINK_SECRET"] = secret
    if service == "api":
        values["secretSettings"]["CASTAD_API_WEBHOOK_SECRETS_KEY"] = secret
    if service != "relay":
        values["artifacts"] = {"store": "s3", "claimName": "c", "mountPath": "/var/lib/castad/artifacts"}
        values["settings"]["CASTAD_ARTIFACTS_S3_BUCKET"] = "media"
    return values


def policies(documents: list[dict]) -> list[dict]:
    found = by_kind(documents, "NetworkPolicy")
    for policy in found:
        check_ip_blocks(policy)
    return found


def check_ip_blocks(policy: dict) -> None:
    """What the API server refuses that a schema cannot see: a cidr with host bits, an except outside its cidr."""
    for direction, side in (("ingress", "from"), ("egress", "to")):
        for rule in policy["spec"].get(direction, []):
            for peer in rule.get(side, []):
                if "ipBlock" not in peer:
                    continue
                cidr = ipaddress.ip_network(peer["ipBlock"]["cidr"])
                for excepted in peer["ipBlock"].get("except", []):
                    inner = ipaddress.ip_network(excepted)
                    assert inner.version == cidr.version and inner.subnet_of(cidr) and inner != cidr, (cidr, inner)


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "the model knows matchLabels only"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _admits_peer(peer: dict, endpoint: Endpoint, namespace: str) -> bool:
    if "ipBlock" in peer:
        if not isinstance(endpoint, str):
            return False  # ipBlocks are for addresses outside the cluster; the charts never count on them for pods
        address = ipaddress.ip_address(endpoint)
        block = peer["ipBlock"]
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
    if not isinstance(endpoint, Pod):
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], endpoint.namespace_labels):
            return False
    elif endpoint.namespace != namespace:
        return False
    return _selects(peer.get("podSelector", {}), endpoint.labels)


def _admits_port(rule: dict, port: int, protocol: str) -> bool:
    if "ports" not in rule:
        return True
    for entry in rule["ports"]:
        assert isinstance(entry.get("port", 0), int), "the model knows port numbers only"
        if entry.get("protocol", "TCP") != protocol:
            continue
        if "port" not in entry or entry["port"] <= port <= entry.get("endPort", entry["port"]):
            return True
    return False


def allowed(found: list[dict], pod: dict[str, str], direction: str, other: Endpoint, port: int, protocol="TCP") -> bool:
    """Whether a pod labelled `pod` in NAMESPACE may connect to `other` (egress) or take its connection (ingress)."""
    kind = direction.capitalize()
    selecting = [
        policy
        for policy in found
        if policy["metadata"].get("namespace", NAMESPACE) == NAMESPACE
        and kind in policy["spec"].get("policyTypes", ["Ingress"])
        and _selects(policy["spec"]["podSelector"], pod)
    ]
    if not selecting:
        return True
    side = "to" if direction == "egress" else "from"
    for policy in selecting:
        for rule in policy["spec"].get(direction, []):
            peers = rule.get(side)
            if _admits_port(rule, port, protocol) and (
                peers is None or any(_admits_peer(peer, other, NAMESPACE) for peer in peers)
            ):
                return True
    return False


def pod_of(documents: list[dict]) -> tuple[dict[str, str], dict]:
    (deployment,) = by_kind(documents, "Deployment")
    template = deployment["spec"]["template"]
    return template["metadata"]["labels"], template["spec"]["containers"][0]


@pytest.mark.parametrize("service", topology.SERVICES)
def test_every_service_renders_a_network_policy_that_selects_its_pods_both_ways(chart_dir, service):
    for values in ({}, network_values(service)):
        documents = render(chart_dir, service, values)
        (policy,) = policies(documents)
        labels, _ = pod_of(documents)
        assert _selects(policy["spec"]["podSelector"], labels)
        assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
        if service != "relay":  # the migrations Job's pods too: they hold the same database Secret
            (job,) = by_kind(documents, "Job")
            assert _selects(policy["spec"]["podSelector"], job["spec"]["template"]["metadata"]["labels"])
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(policy, version, strict=True)


@pytest.mark.parametrize("service", topology.SERVICES)
def test_no_service_reaches_a_cloud_metadata_address(chart_dir, service):
    everywhere = [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    wide_open = network_values(service) | {
        "networkPolicy": {
            "enabled": True,
            # an operator's peers that would take in the metadata servers: the chart takes them out again
            "dns": {"to": everywhere, "ports": [53]},
            "postgresql": {"to": [{"ipBlock": {"cidr": "169.254.0.0/15"}}], "ports": [5432, 80]},
            "rabbitmq": {"to": [{"ipBlock": {"cidr": "100.64.0.0/10"}}], "ports": [5672, 80]},
            "otel": {"to": everywhere},
        }
    }
    for values in ({}, network_values(service), wide_open):
        documents = render(chart_dir, service, values)
        labels, _ = pod_of(documents)
        found = policies(documents)
        for address in METADATA:
            for port in PORTS:
                for protocol in ("TCP", "UDP"):
                    assert not allowed(found, labels, "egress", address, port, protocol), (values, address, port)
        assert allowed(found, labels, "egress", DNS, 53, "UDP") and allowed(found, labels, "egress", DNS, 53, "TCP")


@pytest.mark.parametrize(
    ("cidr", "excepted"),
    [
        ("203.0.113.0/24", []),
        ("160.0.0.0/4", ["169.254.0.0/16"]),
        ("2001:db8::/32", []),
        ("fd00::/8", ["fd00:ec2::254/128", "fd00:ec2::23/128", "fd20:ce::254/128", "fd00:c1::a9fe:a9fe/128"]),
    ],
)
def test_the_chart_takes_metadata_ranges_out_of_exactly_the_blocks_that_hold_them(chart_dir, cidr, excepted):
    values = {"networkPolicy": {"postgresql": {"to": [{"ipBlock": {"cidr": cidr}}], "ports": [5432]}}}
    (policy,) = policies(render(chart_dir, "relay", values))
    (rule,) = [rule for rule in policy["spec"]["egress"] if rule["ports"][0]["port"] == 5432]
    assert rule["to"] == [{"ipBlock": {"cidr": cidr} | ({"except": excepted} if excepted else {})}]


@pytest.mark.parametrize(
    ("cidr", "within"), [("169.254.169.254/32", "169.254.0.0/16"), ("fd00:ec2::254/128", "fd00:ec2::254/128")]
)
def test_a_peer_inside_a_metadata_range_is_refused_naming_it(chart_dir, cidr, within):
    values = {"networkPolicy": {"postgresql": {"to": [{"ipBlock": {"cidr": cidr}}], "ports": [5432]}}}
    with pytest.raises(helm.HelmRenderError, match=within):
        render(chart_dir, "lyric", values)


@pytest.mark.parametrize("service", topology.SERVICES)
def test_each_service_reaches_only_what_it_must(chart_dir, service):
    for label, values in (("offline", {}), ("networked", network_values(service))):
        documents = render(chart_dir, service, values)
        pod, _ = pod_of(documents)
        found = policies(documents)

        def reaches(other: Endpoint, port: int, protocol: str = "TCP") -> bool:
            return allowed(found, pod, "egress", other, port, protocol)  # noqa: B023

        assert reaches(DNS, 53, "UDP") and not reaches(DNS, 443)
        assert reaches(POSTGRES, 5432) and reaches(PRIVATE, 5432)  # in the cluster, or a managed database
        assert reaches(RABBITMQ, 5672) and not reaches(RABBITMQ, 15672)  # not its management API
        assert reaches(JAEGER, 4318)
        # Never to the internet on those ports, where a compromised service could send what it read.
        assert not any(reaches(INTERNET, port) for port in (5432, 5672, 4318)), (label, service)
        gateway = Pod({"app.kubernetes.io/name": "castad-api"})
        assert not reaches(gateway, 8000), "no service calls the gateway: providers do, from outside"
        assert not reaches(INTERNET, 80) and not reaches(PRIVATE, 443)
        # Out to the internet, on 443 only: a stage's provider, the gateway's webhooks, a bucket; the video stage's
        # photos named by URL whatever its provider.
        out = (label == "networked" and service != "relay") or service == "video"
        assert reaches(INTERNET, 443) == out, (label, service)


BUCKET = {
    "artifacts": {"store": "s3", "claimName": "c", "mountPath": "/var/lib/castad/artifacts"},
    "settings": {"CASTAD_ARTIFACTS_S3_BUCKET": "media"},
}


@pytest.mark.parametrize(
    ("service", "values"),
    [
        ("lyric", {"settings": {"CASTAD_LYRIC_PROVIDER": "openai"}}),
        ("song", {"settings": {"CASTAD_SONG_PROVIDER": "suno"}}),
        ("api", {"secretSettings": {"CASTAD_API_WEBHOOK_SECRET": {"existingSecret": "castad", "key": "whsec"}}}),
        ("api", BUCKET),
        ("song", BUCKET),
    ],
)
def test_a_service_goes_out_to_the_internet_only_for_what_it_uses(chart_dir, service, values):
    documents = render(chart_dir, service, values)
    pod, _ = pod_of(documents)
    assert allowed(policies(documents), pod, "egress", INTERNET, 443)
    assert not allowed(policies(render(chart_dir, service, {})), pod, "egress", INTERNET, 443)


def test_the_video_stage_reaches_photo_hosts_on_the_internet_or_where_narrowed_and_never_inside(chart_dir):
    documents = render(chart_dir, "video", {})
    pod, _ = pod_of(documents)
    found = policies(documents)

    assert allowed(found, pod, "egress", INTERNET, 443) and not allowed(found, pod, "egress", INTERNET, 80)
    assert not allowed(found, pod, "egress", PRIVATE, 443) and not allowed(found, pod, "egress", "169.254.169.254", 443)
    proxy = {"photos": {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [3128]}}  # a forward proxy
    narrowed = policies(render(chart_dir, "video", {"networkPolicy": proxy}))
    assert allowed(narrowed, pod, "egress", "192.0.2.7", 3128) and not allowed(narrowed, pod, "egress", INTERNET, 443)


def test_traces_go_to_the_collectors_port_and_nowhere_when_exporting_is_off(chart_dir):
    documents = render(chart_dir, "song", {"otel": {"endpoint": "https://otel.example.com"}})
    pod, _ = pod_of(documents)
    found = policies(documents)
    assert allowed(found, pod, "egress", JAEGER, 443) and not allowed(found, pod, "egress", JAEGER, 4318)
    documents = render(chart_dir, "song", {"otel": {"endpoint": ""}})
    assert not allowed(policies(documents), pod, "egress", JAEGER, 4318)


@pytest.mark.parametrize("service", topology.SERVICES)
def test_pods_take_connections_only_on_their_ports_and_metrics_only_from_inside_the_cluster(chart_dir, service):
    documents = render(chart_dir, service, {})
    pod, container = pod_of(documents)
    found = policies(documents)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probes = ports["probes"]
    assert allowed(found, pod, "ingress", PROMETHEUS, probes)
    assert not allowed(found, pod, "ingress", INTERNET, probes), "metrics and readiness are not for the world"
    assert not allowed(found, pod, "ingress", PROMETHEUS, 9999)
    if service == "api":
        assert allowed(found, pod, "ingress", INTERNET, ports["http"]), "users and providers calling back"
    else:
        assert set(ports) == {"probes"}

    narrowed = {"networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]}}
    documents = render(chart_dir, service, narrowed)
    found = policies(documents)
    assert not allowed(found, pod, "ingress", PROMETHEUS, probes)
    observability = Pod(PROMETHEUS.labels, "monitoring", {"team": "observability"})
    assert allowed(found, pod, "ingress", observability, probes)


def test_the_api_port_can_be_opened_only_to_an_ingress_controller(chart_dir):
    controller = Pod({"app.kubernetes.io/name": "ingress-nginx"}, "ingress-nginx")
    values = {
        "networkPolicy": {
            "apiFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
        }
    }
    documents = render(chart_dir, "api", values)
    pod, _ = pod_of(documents)
    found = policies(documents)
    assert allowed(found, pod, "ingress", controller, 8000) and not allowed(found, pod, "ingress", INTERNET, 8000)


def test_an_operator_narrows_the_databases_and_the_broker_to_addresses_or_turns_the_policy_off(chart_dir):
    values = {
        "networkPolicy": {
            "postgresql": {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [5432]},
            "rabbitmq": {
                "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "databases"}}}],
                "ports": [5671],
            },
        }
    }
    for service in topology.SERVICES:
        documents = render(chart_dir, service, values)
        pod, _ = pod_of(documents)
        found = policies(documents)
        assert allowed(found, pod, "egress", "10.20.1.5", 5432) and not allowed(found, pod, "egress", POSTGRES, 5432)
        assert allowed(found, pod, "egress", RABBITMQ, 5671) and not allowed(found, pod, "egress", RABBITMQ, 5672)
        off = render(chart_dir, service, {"networkPolicy": {"enabled": False}})
        assert not by_kind(off, "NetworkPolicy")


def test_the_umbrella_gives_every_service_the_same_database_and_broker_peers(chart_dir):
    shared = {"postgresql": {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [5432]}}
    documents = render(chart_dir, "castad", {"global": {"networkPolicy": shared}})
    found = policies(documents)
    assert len(found) == len(topology.SERVICES)
    for deployment in by_kind(documents, "Deployment"):
        pod = deployment["spec"]["template"]["metadata"]["labels"]
        assert allowed(found, pod, "egress", "10.20.1.5", 5432) and not allowed(found, pod, "egress", POSTGRES, 5432)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"networkPolicy": {"postgresql": {"to": [{"ipBlock": {"cidr": "10.0.0.0"}}], "ports": [5432]}}}, "cidr"),
        ({"networkPolicy": {"rabbitmq": {"to": [{"podSelector": {}}], "ports": [70000]}}}, "ports"),
        ({"networkPolicy": {"dns": {"to": [{"podSelector": {}, "hosts": ["x"]}], "ports": [53]}}}, "hosts"),
        ({"networkPolicy": {"webhooks": {"to": [], "ports": [443]}}}, "webhooks"),  # the gateway's only
    ],
)
def test_a_wrong_network_policy_value_fails_at_install_time_naming_it(chart_dir, values, complaint):
    with pytest.raises(helm.HelmValuesError, match=complaint):
        helm.Chart.load(chart_dir / "lyric").validate_schema(copy.deepcopy(values))
