"""The Helm charts render, validate against Kubernetes' schemas and cover every setting.

Every rendered manifest (rendering.render, through Helm's own SDK) is validated, strictly (no
unknown field), against the OpenAPI schemas of the oldest and the newest Kubernetes version
the charts support (kubernetes-validate).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from castad_contracts import topology
from castad_local import REPO_ROOT, charts
from castad_runtime import release

from tests.deploy.rendering import KUBERNETES_VERSIONS, by_kind, env_of, render

RELEASE = release.of("api")  # what every chart's appVersion names (tests/unit/test_release.py)

# Value sets besides the defaults: a production-like one and a pared-down one.
PRODUCTION: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"registry": "registry.example.internal", "tag": "0.2.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "otel": {"endpoint": "http://otel-collector.observability:4318"},
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": "25%"},
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "castad", "operator": "Exists", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "podAnnotations": {"castad.example/team": "media"},
    "settings": {"CASTAD_LOG_LEVEL": "DEBUG", "CASTAD_NAMESPACE": "prod"},
}
MINIMAL: dict[str, Any] = {
    "replicaCount": 1,
    "otel": {"endpoint": ""},
    "serviceAccount": {"create": False, "name": "castad-shared"},
    "podDisruptionBudget": {"enabled": False, "maxUnavailable": 1},
}
STAGE_PRODUCTION = {
    "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8},
    "migrations": {"enabled": True},
    "topology": {"enabled": True, "existingSecret": "castad-rabbitmq-admin"},
}
STAGE_MINIMAL = {"migrations": {"enabled": False}}


def value_sets(service: str) -> dict[str, dict[str, Any]]:
    production, minimal = copy.deepcopy(PRODUCTION), copy.deepcopy(MINIMAL)
    if service != "relay":
        production |= STAGE_PRODUCTION
        minimal |= STAGE_MINIMAL
    if service in topology.STAGES:
        upper = service.upper()
        production["settings"] |= {f"CASTAD_{upper}_CONCURRENCY": 8, f"CASTAD_{upper}_STOP_GRACE_S": 45.0}
        production["terminationGracePeriodSeconds"] = 90
    if service == "api":
        production["service"] = {"type": "LoadBalancer", "port": 443}
        production["settings"] |= {"CASTAD_API_MAX_BODY_BYTES": 65536}
    if service == "video":
        production["settings"] |= {"CASTAD_VIDEO_FONT_PATH": "/usr/share/fonts/truetype/nanum/NanumGothic.ttf"}
    if service == "relay":
        production["settings"] |= {"CASTAD_RELAY_MAX_MESSAGE_BYTES": 16777216}
    return {"defaults": {}, "production": production, "minimal": minimal}


@pytest.mark.parametrize("service", topology.SERVICES)
def test_every_value_set_renders_manifests_kubernetes_accepts(chart_dir, service):
    for label, values in value_sets(service).items():
        documents = render(chart_dir, service, values)
        kinds = sorted(doc["kind"] for doc in documents)
        expected = {
            "Deployment",
            "PodDisruptionBudget",
            "ServiceAccount",
            "Job",
            "Service",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
        }
        assert set(kinds) <= expected, (label, kinds)
        for document in documents:
            for version in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(document, version, strict=True)
                except kubernetes_validate.ValidationError as error:
                    pytest.fail(f"{service}/{label}: {document['kind']} invalid on Kubernetes {version}: {error}")


@pytest.mark.parametrize("service", topology.SERVICES)
def test_the_deployment_is_locked_down_probed_and_labelled(chart_dir, service):
    (deployment,) = by_kind(render(chart_dir, service, {}), "Deployment")
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == f"castad-{service}"
    assert labels["app.kubernetes.io/part-of"] == "castad" and labels["app.kubernetes.io/version"] == RELEASE
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == f"localhost/castad/{service}:{RELEASE}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = env_of(container)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "probes"
    health_port = env[f"CASTAD_{service.upper()}_HEALTH_PORT"]
    assert health_port == str(ports["probes"]), "probes must ask the port the service serves them on"
    if service == "api":
        assert env["CASTAD_API_PORT"] == str(ports["http"]) and ports["http"] != ports["probes"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger-collector:4318"
    assert env["OTEL_SERVICE_NAME"] == f"castad-{service}"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("service", topology.SERVICES)
def test_every_setting_the_service_reads_is_reachable_from_its_values(chart_dir, service):
    (deployment,) = by_kind(render(chart_dir, service, {}), "Deployment")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    read = set(charts.variables(service))
    # Settings whose default is "unset" appear once a value is given; everything else is always set.
    unset = {name for name, schema in charts.chart_settings(service).items() if schema.get("default") is None}
    secrets = set(charts.secret_settings(service))  # from secretSettings, when given (see below)
    assert read - unset - secrets - set(env) == set(), f"settings {service} reads that its chart never sets"
    values = yaml.safe_load((REPO_ROOT / "infra" / "helm" / service / "values.yaml").read_text())
    assert set(values["settings"]) == set(charts.chart_settings(service))
    assert set(values["settings"]) | set(charts.from_structure(service)) | set(charts.secret_settings(service)) == read


def test_the_gateway_serves_its_probes_and_metrics_apart_from_the_api_which_alone_its_service_exposes(chart_dir):
    documents = render(chart_dir, "api", {"probesPort": 9090})
    (deployment,) = by_kind(documents, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {"http": 8000, "probes": 9090}
    assert env_of(container)["CASTAD_API_HEALTH_PORT"] == "9090"
    (service,) = by_kind(documents, "Service")
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]

    # Without a port of their own, they stay on the API's, as the gateway serves them then.
    (deployment,) = by_kind(render(chart_dir, "api", {"probesPort": None}), "Deployment")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert "CASTAD_API_HEALTH_PORT" not in env_of(container)
    assert [port["name"] for port in container["ports"]] == ["http"]
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    with pytest.raises(helm.HelmRenderError, match="probesPort"):
        render(chart_dir, "api", {"probesPort": 8000})


def artifact_mounts(chart_dir: Any, service: str, values: dict) -> list[tuple[str, str | None, bool]]:
    """Each mount of the artifacts volume in a service's pod: where, which place of it, read-only or not."""
    (deployment,) = by_kind(render(chart_dir, service, values), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [
        (mount["mountPath"].removeprefix(ROOT), mount.get("subPath"), mount.get("readOnly", False))
        for mount in container["volumeMounts"]
        if mount["name"] == "artifacts"
    ]


ROOT = "/var/lib/castad/artifacts"
# What each stage writes on the volume (its own place) and reads (read-only): what a compromised stage can reach.
PLACES = {
    "api": [("", None, True), ("/images", "images", False)],
    "lyric": [("/lyric", "lyric", False)],
    "song": [("/song", "song", False)],
    "video": [("/video", "video", False), ("/song", "song", True), ("/images", "images", True)],
}


@pytest.mark.parametrize("store", ("volume", "s3"))
def test_each_stage_writes_its_own_place_alone_and_the_gateway_only_the_images_tenants_upload(chart_dir, store):
    artifacts = {"store": store, "claimName": "castad-artifacts", "mountPath": ROOT}
    values = {"artifacts": artifacts, "settings": {"CASTAD_ARTIFACTS_S3_BUCKET": "media"}}
    for service in topology.WITH_DATABASE:
        mounts = artifact_mounts(chart_dir, service, values)
        if store == "volume":
            assert mounts == PLACES[service], service
        else:  # scratch space; uploads and artifacts go to the bucket
            assert mounts == [("", None, service == "api")], service


@pytest.mark.parametrize("service", topology.STAGES)
def test_a_stage_mounts_the_whole_volume_only_when_asked_for_files_of_a_release_before(chart_dir, service):
    artifacts = {"store": "volume", "claimName": "castad-artifacts", "mountPath": ROOT, "wholeVolume": True}

    assert artifact_mounts(chart_dir, service, {"artifacts": artifacts}) == [("", None, False)]
    with pytest.raises(helm.HelmValuesError, match="reads"):
        render(chart_dir, service, {"artifacts": {**artifacts, "wholeVolume": False, "reads": [service]}})


@pytest.mark.parametrize("service", ("api", "video"))
def test_with_a_bucket_the_volume_is_scratch_space_and_credentials_come_from_a_secret(chart_dir, service):
    artifacts = {
        "store": "s3",
        "claimName": "unused",
        "mountPath": "/var/lib/castad/artifacts",
        "scratchSizeLimit": "3Gi",
        "credentialsSecret": "castad-s3",
    }
    values = {"artifacts": artifacts, "settings": {"CASTAD_ARTIFACTS_S3_BUCKET": "media"}}
    (deployment,) = by_kind(render(chart_dir, service, values), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(container)
    assert (env["CASTAD_ARTIFACTS_STORE"], env["CASTAD_ARTIFACTS_S3_BUCKET"]) == ("s3", "media")
    assert container["envFrom"] == [{"secretRef": {"name": "castad-s3"}}]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "artifacts"]
    assert volume == {"name": "artifacts", "emptyDir": {"sizeLimit": "3Gi"}}
    (default,) = by_kind(render(chart_dir, service, {}), "Deployment")
    assert "envFrom" not in default["spec"]["template"]["spec"]["containers"][0]


def test_a_providers_key_comes_from_a_secret_and_never_from_plain_values(chart_dir):
    key = {"existingSecret": "openai", "key": "api-key"}
    values = {"settings": {"CASTAD_LYRIC_PROVIDER": "openai"}, "secretSettings": {"CASTAD_LYRIC_OPENAI_API_KEY": key}}
    (deployment,) = by_kind(render(chart_dir, "lyric", values), "Deployment")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["CASTAD_LYRIC_OPENAI_API_KEY"] == {"secretKeyRef": {"name": "openai", "key": "api-key"}}
    # Least privilege: the lyric stage signs no link and holds no link key; each signing stage only its own.
    assert charts.secret_settings("lyric") == ["CASTAD_LYRIC_OPENAI_API_KEY"]
    assert charts.secret_settings("song") == ["CASTAD_SONG_LINK_SECRET", "CASTAD_SONG_SUNO_API_KEY"]
    assert charts.secret_settings("video") == ["CASTAD_VIDEO_LINK_SECRET", "CASTAD_VIDEO_CREATOMATE_API_KEY"]
    assert charts.secret_settings("api") == [
        "CASTAD_API_WEBHOOK_SECRETS_KEY",
        "CASTAD_API_WEBHOOK_SECRET",
        "CASTAD_API_LINK_SECRET",
    ]


def test_a_layer_of_the_values_schema_for_no_known_services_is_refused_naming_it(tmp_path, monkeypatch):
    mistyped = tmp_path / "values.schema.yaml"
    mistyped.write_text(charts.SCHEMA.read_text().replace("- for: stages\n", "- for: stage\n"))
    monkeypatch.setattr(charts, "SCHEMA", mistyped)
    with pytest.raises(ValueError, match="'stage'"):
        charts.values_schema("song")


def test_the_committed_settings_blocks_and_schemas_are_current():
    for service in topology.SERVICES:
        directory = REPO_ROOT / "infra" / "helm" / service
        assert (directory / "values.yaml").read_text() == charts.values_yaml(service), "run castad-admin charts"
        committed = yaml.safe_load((directory / "values.schema.json").read_text())
        assert committed == charts.values_schema(service), "run castad-admin charts"


@pytest.mark.parametrize(
    ("service", "values", "complaint"),
    [
        ("lyric", {"settings": {"CASTAD_LYRIC_MAX_ATTEMPTS": "five"}}, "CASTAD_LYRIC_MAX_ATTEMPTS"),
        ("lyric", {"settings": {"CASTAD_LYRIC_MAX_ATTEMPTS": 0}}, "CASTAD_LYRIC_MAX_ATTEMPTS"),
        ("song", {"settings": {"CASTAD_SONG_PROVIDER": "musicbox"}}, "CASTAD_SONG_PROVIDER"),
        ("video", {"settings": {"CASTAD_VIDEO_MAX_ATEMPTS": 3}}, "CASTAD_VIDEO_MAX_ATEMPTS"),
        ("api", {"settings": {"CASTAD_LOG_LEVEL": "LOUD"}}, "CASTAD_LOG_LEVEL"),
        ("api", {"replicas": 3}, "replicas"),
        ("api", {"service": {"type": "Ingress", "port": 80}}, "type"),
        ("relay", {"replicaCount": 0}, "replicaCount"),
        ("relay", {"sources": []}, "sources"),
        ("song", {"database": {"existingSecret": "", "key": "url"}}, "existingSecret"),
        ("video", {"otel": {"endpoint": "jaeger:4318"}}, "endpoint"),
        ("song", {"artifacts": {"store": "gcs", "claimName": "c", "mountPath": "/a"}}, "store"),
        ("lyric", {"global": {"settings": {"CASTAD_LYRIC_CONCURRENCY": 4}}}, "CASTAD_LYRIC_CONCURRENCY"),
        ("lyric", {"settings": {"CASTAD_LYRIC_OPENAI_API_KEY": "sk-in-plain-sight"}}, "CASTAD_LYRIC_OPENAI_API_KEY"),
        ("lyric", {"secretSettings": {"CASTAD_LYRIC_OPENAI_MODEL": {"existingSecret": "s", "key": "k"}}}, "MODEL"),
        ("lyric", {"secretSettings": {"CASTAD_LYRIC_OPENAI_API_KEY": {"existingSecret": "s"}}}, "key"),
    ],
)
def test_a_wrong_value_fails_at_install_time_naming_it(chart_dir, service, values, complaint):
    with pytest.raises(helm.HelmValuesError, match=complaint):
        helm.Chart.load(chart_dir / service).validate_schema(values)


def test_a_termination_grace_shorter_than_the_drain_is_refused(chart_dir):
    values = {"settings": {"CASTAD_VIDEO_STOP_GRACE_S": 60.0}, "terminationGracePeriodSeconds": 70}
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render(chart_dir, "video", values)
    assert by_kind(render(chart_dir, "video", values | {"terminationGracePeriodSeconds": 80}), "Deployment")


@pytest.mark.parametrize("service", topology.WITH_DATABASE)
def test_migrations_run_as_a_hook_before_new_pods_with_the_database_secret(chart_dir, service):
    for upgrade in (False, True):
        (job,) = by_kind(render(chart_dir, service, {}, upgrade=upgrade), "Job")
        annotations = job["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["args"] == ["migrate"]
        secret = env_of(container)[f"CASTAD_{service.upper()}_DATABASE_URL"]["secretKeyRef"]
        assert secret == {"name": f"castad-{service}-database", "key": "url"}
        assert job["metadata"]["name"].endswith(f"-migrate-{2 if upgrade else 1}")


@pytest.mark.parametrize("service", topology.WITH_DATABASE)
def test_with_an_administrators_secret_a_hook_declares_the_topology_before_the_migrations(chart_dir, service):
    (only,) = by_kind(render(chart_dir, service, {}), "Job")  # off by default: `castad-admin topology` declares it
    assert only["metadata"]["name"].endswith("-migrate-1")

    values = {"topology": {"enabled": True, "existingSecret": "castad-rabbitmq-admin"}}
    for upgrade in (False, True):
        jobs = {
            job["spec"]["template"]["spec"]["containers"][0]["args"][0]: job
            for job in by_kind(render(chart_dir, service, values, upgrade=upgrade), "Job")
        }
        hooks = {args: job["metadata"]["annotations"] for args, job in jobs.items()}
        assert hooks["declare"]["helm.sh/hook"] == hooks["migrate"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert int(hooks["declare"]["helm.sh/hook-weight"]) < int(hooks["migrate"]["helm.sh/hook-weight"])
        (container,) = jobs["declare"]["spec"]["template"]["spec"]["containers"]
        secret = env_of(container)["CASTAD_TOPOLOGY_AMQP_URL"]["secretKeyRef"]
        assert secret == {"name": "castad-rabbitmq-admin", "key": "url"}
        assert jobs["declare"]["metadata"]["name"].endswith(f"-topology-{2 if upgrade else 1}")

    with pytest.raises(Exception, match="topology.existingSecret"):
        render(chart_dir, service, {"topology": {"enabled": True}})


def test_the_relay_reads_every_source_from_its_secret_and_joins_them(chart_dir):
    (deployment,) = by_kind(render(chart_dir, "relay", {}), "Deployment")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    names = ("API", "LYRIC", "SONG", "VIDEO")
    # each URL named by its service: the relay publishes from a database only that service's event types
    assert env["CASTAD_RELAY_SOURCES"] == ",".join(f"{name.lower()}=$(CASTAD_RELAY_SOURCE_{name})" for name in names)
    order = [item["name"] for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]]
    for name in names:  # Kubernetes expands $(VAR) only from variables defined earlier
        assert order.index(f"CASTAD_RELAY_SOURCE_{name}") < order.index("CASTAD_RELAY_SOURCES")
        # the relay's own role on each database (reading and marking the outbox), not the service's
        assert env[f"CASTAD_RELAY_SOURCE_{name}"]["secretKeyRef"]["name"] == f"castad-relay-{name.lower()}-database"


@pytest.mark.parametrize("service", topology.SERVICES)
def test_each_service_has_a_broker_user_of_its_own(chart_dir, service):
    (deployment,) = by_kind(render(chart_dir, service, {}), "Deployment")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["CASTAD_AMQP_URL"]["secretKeyRef"] == {"name": f"castad-{service}-rabbitmq", "key": "url"}


def test_numbers_reach_the_environment_as_the_service_parses_them(chart_dir):
    (deployment,) = by_kind(render(chart_dir, "relay", {}), "Deployment")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["CASTAD_RELAY_MAX_MESSAGE_BYTES"] == "16777216"
    assert env["CASTAD_HOLD_EVENTS_S"] == "3600"
    assert "CASTAD_VIDEO_FONT_PATH" not in env


def test_the_umbrella_installs_every_service_sharing_one_volume_and_global_settings(chart_dir):
    values = {"global": {"settings": {"CASTAD_NAMESPACE": "media"}, "otel": {"endpoint": ""}}}
    documents = render(chart_dir, "castad", values)
    deployments = {
        doc["metadata"]["labels"]["app.kubernetes.io/component"]: doc for doc in by_kind(documents, "Deployment")
    }
    assert set(deployments) == set(topology.SERVICES)
    (claim,) = by_kind(documents, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for service, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        env = env_of(pod["containers"][0])
        assert env["CASTAD_NAMESPACE"] == "media" and env["OTEL_TRACES_EXPORTER"] == "none"
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        if service != "relay":
            assert volumes["artifacts"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[-1], strict=True)

    without_video = render(chart_dir, "castad", {"video": {"enabled": False}})
    assert {doc["metadata"]["name"] for doc in by_kind(without_video, "Deployment")} == {
        f"prod-castad-{service}" for service in topology.SERVICES if service != "video"
    }


@pytest.mark.parametrize("name", (*topology.SERVICES, "castad"))
def test_helm_lint_finds_nothing(chart_dir, name):
    report = helm.lint(chart_dir / name, strict=True, kube_version=f"v{KUBERNETES_VERSIONS[-1]}")
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert problems == [] and report["errors"] == [], report


@pytest.mark.parametrize("service", topology.SERVICES)
def test_pods_are_annotated_for_prometheus_and_a_pod_monitor_is_there_only_when_asked(chart_dir, service):
    documents = render(chart_dir, service, {"podAnnotations": {"castad.example/team": "media"}})
    (deployment,) = by_kind(documents, "Deployment")
    template = deployment["spec"]["template"]
    (port,) = [p["containerPort"] for p in template["spec"]["containers"][0]["ports"] if p["name"] == "probes"]
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        "castad.example/team": "media",
    }
    assert not by_kind(documents, "PodMonitor")

    quiet = render(
        chart_dir, service, {"metrics": {"scrape": False, "podMonitor": {"enabled": False, "interval": "30s"}}}
    )
    (deployment,) = by_kind(quiet, "Deployment")
    assert "annotations" not in deployment["spec"]["template"]["metadata"]

    monitored = render(
        chart_dir,
        service,
        {"metrics": {"scrape": False, "podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "x"}}}},
    )
    (deployment,) = by_kind(monitored, "Deployment")
    (monitor,) = by_kind(monitored, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["metadata"]["labels"]["release"] == "x"
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"  # job castad-<service>, as alerts.yml expects
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "probes", "path": "/metrics", "interval": "15s"}]


# Replicas over nodes. `place` is the scheduler's topology-spread filter (the DoNotSchedule constraints), as
# Kubernetes documents it, run over a made-up cluster: enough to ask whether rendered constraints let a pod onto a
# node, which kubernetes-validate (a schema) cannot.


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    zone: str = "zone-a"
    tainted: bool = False  # node-role.kubernetes.io/control-plane:NoSchedule, as a control-plane node has

    @property
    def labels(self) -> dict[str, str]:
        return {"kubernetes.io/hostname": self.name, "topology.kubernetes.io/zone": self.zone}


@dataclasses.dataclass(frozen=True)
class Pod:
    labels: dict[str, str]
    node: str


def tolerates(pod_spec: dict, node: Node) -> bool:
    return not node.tainted or any(
        toleration.get("key") == "node-role.kubernetes.io/control-plane"
        for toleration in pod_spec.get("tolerations", [])
    )


def place(pod_spec: dict, labels: dict[str, str], cluster: list[Node], running: list[Pod]) -> str | None:
    """The node a new pod goes to (of the nodes its constraints allow, the one with fewest pods), or None: Pending."""
    allowed = [
        node
        for node in cluster
        if tolerates(pod_spec, node) and _spread_allows(pod_spec, labels, node, cluster, running)
    ]
    if not allowed:
        return None
    return min(allowed, key=lambda node: (sum(pod.node == node.name for pod in running), node.name)).name


def _spread_allows(pod_spec: dict, labels: dict[str, str], node: Node, cluster: list[Node], running: list[Pod]) -> bool:
    for constraint in pod_spec.get("topologySpreadConstraints", []):
        if constraint["whenUnsatisfiable"] != "DoNotSchedule":
            continue  # only scores nodes
        key, selector = constraint["topologyKey"], constraint["labelSelector"]
        assert set(selector) == {"matchLabels"}, "the simulation knows matchLabels only"
        # matchLabelKeys: only pods with the new pod's values of these labels (its version's, pod-template-hash).
        matches = (
            selector["matchLabels"] | {k: labels[k] for k in constraint.get("matchLabelKeys", ()) if k in labels}
        ).items()
        if key not in node.labels:
            return False
        eligible = [n for n in cluster if key in n.labels]
        if constraint.get("nodeTaintsPolicy", "Ignore") == "Honor":
            eligible = [n for n in eligible if tolerates(pod_spec, n)]
        domain_of = {n.name: n.labels[key] for n in eligible}
        counts = dict.fromkeys(domain_of.values(), 0)
        for pod in running:
            if pod.node in domain_of and matches <= pod.labels.items():
                counts[domain_of[pod.node]] += 1
        minimum = min(counts.values()) if len(counts) >= constraint.get("minDomains", 1) else 0
        itself = 1 if matches <= labels.items() else 0
        if counts.get(node.labels[key], 0) + itself - minimum > constraint["maxSkew"]:
            return False
    return True


def start_replicas(deployment: dict, cluster: list[Node]) -> list[Pod]:
    """Schedule the Deployment's replicas one by one, as its ReplicaSet creates them; those placed."""
    template = deployment["spec"]["template"]
    running: list[Pod] = []
    for _ in range(deployment["spec"]["replicas"]):
        node = place(template["spec"], template["metadata"]["labels"], cluster, running)
        if node is not None:
            running.append(Pod(template["metadata"]["labels"], node))
    return running


def node_spread(deployment: dict) -> dict:
    constraints = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    (nodes,) = [c for c in constraints if c["topologyKey"] == "kubernetes.io/hostname"]
    return nodes


@pytest.mark.parametrize("service", topology.SERVICES)
def test_every_service_keeps_its_replicas_on_separate_nodes_by_default(chart_dir, service):
    (deployment,) = by_kind(render(chart_dir, service, {}), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    template = deployment["spec"]["template"]
    nodes = node_spread(deployment)
    assert (nodes["maxSkew"], nodes["whenUnsatisfiable"], nodes["minDomains"]) == (1, "DoNotSchedule", 2)
    (zones,) = [
        c for c in template["spec"]["topologySpreadConstraints"] if c["topologyKey"] != "kubernetes.io/hostname"
    ]
    assert (zones["topologyKey"], zones["whenUnsatisfiable"]) == ("topology.kubernetes.io/zone", "ScheduleAnyway")
    for constraint in (nodes, zones):
        # It counts this service's replicas: every one of them, none of another service or of the migrations Job.
        selector = constraint["labelSelector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items()
        assert deployment["spec"]["selector"]["matchLabels"].items() <= selector.items()
        assert selector["app.kubernetes.io/component"] == service
    pods = start_replicas(deployment, [Node("node-1"), Node("node-2"), Node("node-3")])
    assert len({pod.node for pod in pods}) == 2


@pytest.mark.parametrize("service", topology.SERVICES)
def test_a_one_node_cluster_cannot_hold_two_replicas_of_a_service(chart_dir, service):
    # The point: with replicaCount 2 the rendered constraints leave the second replica Pending on a 1-node cluster,
    # rather than putting both where one node's loss takes the whole service.
    (deployment,) = by_kind(render(chart_dir, service, {"replicaCount": 2}), "Deployment")
    assert [pod.node for pod in start_replicas(deployment, [Node("only")])] == ["only"]
    # Nor can two nodes hold three, nor three (one a control plane the pods do not tolerate) hold three.
    (three,) = by_kind(render(chart_dir, service, {"replicaCount": 3}), "Deployment")
    assert len(start_replicas(three, [Node("node-1"), Node("node-2")])) == 2
    assert len(start_replicas(three, [Node("node-1"), Node("node-2"), Node("control", tainted=True)])) == 2


@pytest.mark.parametrize("service", ("api", "relay", "video"))
def test_a_rolling_update_on_as_many_nodes_as_replicas_ends_with_one_replica_per_node(chart_dir, service):
    # maxSurge 1 and maxUnavailable 0: no old replica goes before a new one is ready, so a surge pod that no node
    # takes stalls the rollout for good (as a required podAntiAffinity on the hostname would), and new pods that
    # join one node leave two replicas there once the old ones are gone. A tainted control-plane node must not
    # count as a node with no replica.
    (deployment,) = by_kind(render(chart_dir, service, {}), "Deployment")
    cluster = [Node("node-1", "zone-a"), Node("node-2", "zone-b"), Node("control", "zone-a", tainted=True)]
    old = start_replicas(deployment, cluster)
    assert sorted(pod.node for pod in old) == ["node-1", "node-2"]
    template = deployment["spec"]["template"]
    new_labels = template["metadata"]["labels"] | {"pod-template-hash": "new"}
    old = [Pod(pod.labels | {"pod-template-hash": "old"}, pod.node) for pod in old]
    running, new = list(old), []
    while old:
        surge = place(template["spec"], new_labels, cluster, running)
        assert surge is not None, f"the surge pod found no node beside {running}"
        new.append(Pod(new_labels, surge))
        # Ready: an old replica goes, the ReplicaSet taking first one that shares its node.
        gone = max(old, key=lambda p: sum(q.node == p.node for q in old + new))
        old.remove(gone)
        running = old + new
    assert sorted(pod.node for pod in new) == ["node-1", "node-2"]


def test_with_an_autoscaler_its_minimum_replicas_never_share_a_node_and_more_spread_evenly(chart_dir):
    values = {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 8}}
    (deployment,) = by_kind(render(chart_dir, "song", values), "Deployment")
    assert node_spread(deployment)["minDomains"] == 3
    deployment["spec"]["replicas"] = 3  # what the autoscaler starts with
    assert len(start_replicas(deployment, [Node("node-1"), Node("node-2")])) == 2

    values = {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8}}
    (deployment,) = by_kind(render(chart_dir, "song", values), "Deployment")
    deployment["spec"]["replicas"] = 4  # scaled out under load, past the number of nodes the pods may use
    cluster = [Node("node-1"), Node("node-2"), Node("control", tainted=True)]
    assert sorted(pod.node for pod in start_replicas(deployment, cluster)) == ["node-1", "node-1", "node-2", "node-2"]


@pytest.mark.parametrize("service", topology.SERVICES)
def test_an_operator_can_let_replicas_share_nodes_replace_the_spread_or_turn_it_off(chart_dir, service):
    shared = {"replicaCount": 2, "spread": {"enabled": True, "nodes": "ScheduleAnyway", "zones": "ScheduleAnyway"}}
    (deployment,) = by_kind(render(chart_dir, service, shared), "Deployment")
    assert "minDomains" not in node_spread(deployment)  # Kubernetes refuses it beside ScheduleAnyway
    assert len(start_replicas(deployment, [Node("only")])) == 2

    own = [{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}]
    (deployment,) = by_kind(render(chart_dir, service, {"topologySpreadConstraints": own}), "Deployment")
    (constraint,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    replicas = deployment["spec"]["selector"]["matchLabels"] | {"app.kubernetes.io/component": service}
    assert constraint == own[0] | {"labelSelector": {"matchLabels": replicas}}
    given = {"matchLabels": {"team": "media"}}
    (deployment,) = by_kind(
        render(chart_dir, service, {"topologySpreadConstraints": [own[0] | {"labelSelector": given}]}), "Deployment"
    )
    assert deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"] == given

    (deployment,) = by_kind(render(chart_dir, service, {"spread": {"enabled": False}}), "Deployment")
    assert "topologySpreadConstraints" not in deployment["spec"]["template"]["spec"]
    assert len(start_replicas(deployment, [Node("only")])) == 2


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"spread": {"nodes": "Never"}}, "nodes"),
        ({"spread": {"enabled": True, "hosts": "DoNotSchedule"}}, "hosts"),
        ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname"}]}, "whenUnsatisfiable"),
    ],
)
def test_a_wrong_spread_fails_at_install_time_naming_it(chart_dir, values, complaint):
    with pytest.raises(helm.HelmValuesError, match=complaint):
        helm.Chart.load(chart_dir / "relay").validate_schema(values)


def test_the_umbrella_keeps_every_services_replicas_on_separate_nodes(chart_dir):
    for deployment in by_kind(render(chart_dir, "castad", {}), "Deployment"):
        assert len(start_replicas(deployment, [Node("only")])) == 1, deployment["metadata"]["name"]
