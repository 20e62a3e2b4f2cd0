"""docker-compose.yml, read without Docker: every command runs a module that exists, every variable
is one its settings class reads, ports and versions agree with the rest of the repository."""

from __future__ import annotations

import importlib
import inspect
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import BaseModel

from gangline.cluster_spec import load_cluster_spec
from gangline.store.pool import DSN_ENV
from gangline.telemetry.metrics import METRICS_PORTS
from services.api.auth import load_tokens
from services.common.env import PREFIX, ServiceSettings
from services.common.queues import DEFAULT_QUEUE, QueuesFile, load_queues

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
GANGLINE = {name: s for name, s in SERVICES.items() if s.get("image") == "gangline:dev"}
LONG_RUNNING = {
    "admission",
    "quota",
    "placement",
    "preemption",
    "node-health",
    "ledger",
    "analytics",
    "api",
    "fake-nodes",
}
READ_QUEUES = ("admission", "quota", "api", "placement", "preemption")
"""Placement and preemption read which queues are unlimited: placed without quota's job.queued."""
"""The services that read the queue configuration (GANGLINE_QUEUES_FILE)."""
EXAMPLE_QUEUES = ROOT / "deploy" / "docker" / "queues.yaml"
RETIRED = {"GANGLINE_QUEUES", "GANGLINE_QUEUE_LIMITS"}
"""Variables that described queues before the queues file; nothing sets them any more."""
# Modules that read GANGLINE_* without a settings class, and the variables they read.
KAFKA_CLIENT_ENV = {
    "GANGLINE_KAFKA_BOOTSTRAP",
    "GANGLINE_KAFKA_SECURITY_PROTOCOL",
    "GANGLINE_KAFKA_USERNAME",
    "GANGLINE_KAFKA_PASSWORD",
    "GANGLINE_KAFKA_PASSWORD_FILE",
    "GANGLINE_LOG_LEVEL",
    "GANGLINE_OTLP_ENDPOINT",
}
"""What the admin one-shot reads: its credentials (gangline.bus.security), from the shared environment."""
PLAIN_ENV = {"gangline.store.migrate": {DSN_ENV}, "gangline.bus.admin": KAFKA_CLIENT_ENV}

_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolated(value: object) -> str:
    """The value as compose would see it with none of the variables set (their defaults)."""
    return _VARIABLE.sub(lambda m: m.group(2) or "", str(value))


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: interpolated(v) for k, v in (service.get("environment") or {}).items()}


def module_of(service: dict[str, Any]) -> str:
    command = service["command"]
    assert command[:2] == ["python", "-m"], f"run modules with python -m: {command}"
    return str(command[2])


def module_file(module: str) -> Path:
    base = ROOT / "libs" if module.startswith("gangline.") else ROOT
    path = base.joinpath(*module.split("."))
    return path / "__main__.py" if path.is_dir() else path.with_suffix(".py")


def settings_class(module: str) -> type[ServiceSettings]:
    """The service's settings class: the ServiceSettings subclass in services/<name>/settings.py."""
    package = module.removesuffix(".__main__")
    if not (ROOT.joinpath(*package.split(".")) / "settings.py").exists():
        return ServiceSettings
    settings = importlib.import_module(f"{package}.settings")
    found = [
        cls
        for _, cls in inspect.getmembers(settings, inspect.isclass)
        if issubclass(cls, ServiceSettings)
        and cls is not ServiceSettings
        and cls.__module__ == settings.__name__
    ]
    assert len(found) == 1, f"{package}.settings should define one settings class, found {found}"
    return found[0]


def test_the_whole_system_is_there() -> None:
    assert {"kafka", "postgres", "topic-init", "db-migrate"} | LONG_RUNNING <= set(SERVICES)
    assert {module_of(SERVICES[s]) for s in LONG_RUNNING} == {
        "services.admission",
        "services.quota",
        "services.placement",
        "services.preemption",
        "services.node_health",
        "services.ledger",
        "services.analytics",
        "services.api",
        "services.agent",
    }


@pytest.mark.parametrize("name", sorted(GANGLINE))
def test_every_command_runs_a_module_that_exists(name: str) -> None:
    module = module_of(GANGLINE[name])
    path = module_file(module)
    assert path.is_file(), f"{name}: {module} is not a module here ({path})"
    if path.name != "__main__.py":
        assert 'if __name__ == "__main__":' in path.read_text(), f"{module} cannot be run with python -m"


@pytest.mark.parametrize("name", sorted(GANGLINE))
def test_every_variable_is_one_the_settings_class_reads(name: str) -> None:
    module = module_of(GANGLINE[name])
    env = environment(GANGLINE[name])
    assert all(k.startswith(PREFIX) for k in env), f"{name}: only GANGLINE_* variables configure services"
    if module in PLAIN_ENV:
        assert set(env) <= PLAIN_ENV[module], f"{name}: {module} reads only {PLAIN_ENV[module]}"
        return
    cls = settings_class(module)
    unknown = sorted(k for k in env if k.removeprefix(PREFIX).lower() not in cls.model_fields)
    assert not unknown, f"{name}: {cls.__name__} has no field for {unknown}"
    settings = cls.from_env(env)  # and the values are valid for it
    assert isinstance(settings, BaseModel)
    assert settings.kafka_bootstrap == "kafka:9092"


def test_images_are_pinned_and_kafka_matches_the_broker_the_tests_run() -> None:
    pom = ET.parse(ROOT / "deploy" / "kafka" / "pom.xml").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    kafka_version = pom.findtext("m:properties/m:kafka.version", namespaces=ns)
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{kafka_version}"
    assert SERVICES["postgres"]["image"].startswith("postgres:")
    for name, service in SERVICES.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image ({image})"


def test_the_image_is_built_from_the_dockerfile_on_the_projects_python() -> None:
    for service in GANGLINE.values():
        build = service["build"]
        dockerfile = ROOT / build["context"] / build["dockerfile"]
        assert dockerfile.is_file()
    text = dockerfile.read_text()
    base = re.search(r"^FROM python:(\d+\.\d+)", text, re.MULTILINE)
    assert base is not None and base.group(1) == "3.11"
    assert "USER " in text, "the services do not run as root"


def test_ports_are_published_on_loopback_and_agree_with_the_settings() -> None:
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: publish on 127.0.0.1 only ({port})"
    analytics = SERVICES["analytics"]
    analytics_port = environment(analytics)["GANGLINE_ANALYTICS_PORT"]
    assert [p.rsplit(":", 1)[1] for p in analytics["ports"]] == [analytics_port]
    api = SERVICES["api"]
    api_port = environment(api)["GANGLINE_PORT"]
    assert api["ports"][0].rsplit(":", 1)[1] == api_port
    assert f"127.0.0.1:{api_port}/healthz" in " ".join(api["healthcheck"]["test"])
    start = (ROOT / "deploy" / "kafka" / "compose-start.sh").read_text()
    advertised = re.search(r"^advertised\.listeners=(.*)$", start, re.MULTILINE)
    assert advertised is not None and "CLIENT://kafka:9092" in advertised.group(1).split(",")
    protocols = re.search(r"^listener\.security\.protocol\.map=(.*)$", start, re.MULTILINE)
    assert protocols is not None and all(p.endswith(":SASL_PLAINTEXT") for p in protocols.group(1).split(","))
    postgres = SERVICES["postgres"]["environment"]
    for name, service in SERVICES.items():
        dsn = environment(service).get(DSN_ENV)
        if dsn is None:
            continue
        url = urlsplit(dsn)
        assert (url.hostname, url.port, url.path) == ("postgres", 5432, "/" + postgres["POSTGRES_DB"]), name
        assert url.password == interpolated(postgres["POSTGRES_PASSWORD"]), name


def test_every_service_publishes_its_metrics_port_on_loopback() -> None:
    for name in LONG_RUNNING:
        service = (
            "agent"
            if module_of(SERVICES[name]) == "services.agent"
            else module_of(SERVICES[name]).split(".")[1]
        )
        port = METRICS_PORTS[service]
        assert f"127.0.0.1:{port}:{port}" in SERVICES[name].get("ports", []), (
            f"{name}: publish /metrics ({port})"
        )
        host = "GANGLINE_ANALYTICS_HOST" if service == "analytics" else "GANGLINE_METRICS_HOST"
        assert environment(SERVICES[name])[host] == "0.0.0.0", name


def test_start_order_waits_on_health_and_one_shots() -> None:
    for name, service in SERVICES.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], f"{dependency} has no healthcheck"
            elif condition == "service_completed_successfully":
                assert SERVICES[dependency].get("restart") == "no", f"{dependency} is not a one-shot"
    for name in LONG_RUNNING:
        assert SERVICES[name]["depends_on"]["topic-init"]["condition"] == "service_completed_successfully"
    for name in ("ledger", "api"):
        assert SERVICES[name]["depends_on"]["db-migrate"]["condition"] == "service_completed_successfully"
    assert SERVICES["topic-init"]["depends_on"] == {"kafka": {"condition": "service_healthy"}}


def test_the_files_the_services_are_given_exist_and_parse() -> None:
    tokens = ROOT / COMPOSE["secrets"]["api_tokens"]["file"]
    assert load_tokens(file=tokens, inline=None).tenants
    spec = SERVICES["fake-nodes"]["command"]
    assert (ROOT / spec[spec.index("--spec") + 1]).is_file()
    for volume in SERVICES["otel-collector"]["volumes"]:
        assert (ROOT / volume.split(":")[0]).is_file()


def queues_file_in(name: str) -> Path:
    """The host file compose mounts where the service's GANGLINE_QUEUES_FILE points."""
    service = SERVICES[name]
    path = environment(service).get("GANGLINE_QUEUES_FILE")
    assert path is not None, f"{name}: set GANGLINE_QUEUES_FILE"
    mounted = {c["target"]: c["source"] for c in service.get("configs", [])}
    assert path in mounted, f"{name}: {path} is not a config mounted into the container ({mounted})"
    return ROOT / str(COMPOSE["configs"][mounted[path]]["file"])


@pytest.mark.parametrize("name", READ_QUEUES)
def test_every_reader_of_queues_reads_the_one_example_queues_file(name: str) -> None:
    path = queues_file_in(name)
    assert path.resolve() == EXAMPLE_QUEUES.resolve()
    assert load_queues(path).names() == [DEFAULT_QUEUE, "team-a", "team-b"]
    assert not RETIRED & set(environment(SERVICES[name]))


def test_no_service_is_given_the_old_queue_variables() -> None:
    for name, service in SERVICES.items():
        assert not RETIRED & set(environment(service)), name


def test_the_example_queues_fit_the_simulated_cluster_and_the_tenants() -> None:
    queues = load_queues(EXAMPLE_QUEUES)
    spec = SERVICES["fake-nodes"]["command"]
    cluster = load_cluster_spec(ROOT / spec[spec.index("--spec") + 1])
    have: dict[str, int] = {}
    for group in cluster.groups:
        have[group.gpu_model] = have.get(group.gpu_model, 0) + group.count * group.gpus_per_node
    assert queues.unlimited == {DEFAULT_QUEUE}  # open to every producer
    teams = [q for q in queues.names() if queues.limited(q)]
    assert teams == ["team-a", "team-b"]
    assert {queues.tree.spec(q).cohort for q in teams} == {"everyone"}
    # Quotas name the cluster's models and promise no more than it has, leaving room for `default`.
    assert set(queues.resource_order) == set(have)
    for model, gpus in have.items():
        promised = sum(queues.tree.nominal(q, model) for q in teams)
        assert 0 < promised < gpus, (model, promised, gpus)
    assert any(queues.tree.borrowing_limit(q, r) is not None for q in teams for r in queues.resource_order)
    # Every tenant of the development tokens may submit to a queue admission knows.
    tokens = load_tokens(file=ROOT / COMPOSE["secrets"]["api_tokens"]["file"], inline=None)
    for tenant in tokens.tenants:
        assert all(queues.known(q) for q in tenant.queues), tenant.name


K8S = ROOT / "deploy" / "k8s"


def k8s_documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [
        doc
        for resource in kustomization["resources"]
        for doc in yaml.safe_load_all((K8S / resource).read_text())
        if doc
    ]


def test_k8s_manifests_run_modules_that_exist_with_variables_their_settings_read() -> None:
    docs = k8s_documents()
    shared = next(
        d["data"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gangline-env"
    )
    containers = [
        c
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    modules = set()
    for container in containers:
        command = " ".join(container["command"])
        module = re.search(r"python -m ([\w.]+)", command)
        assert module is not None, f"{container['name']}: run a module with python -m"
        modules.add(module.group(1))
        assert module_file(module.group(1)).is_file()
        names = {e["name"] for e in container.get("env", [])}
        if any(
            ref.get("configMapRef", {}).get("name") == "gangline-env" for ref in container.get("envFrom", [])
        ):
            names |= set(shared)
        if module.group(1) in PLAIN_ENV:
            assert names <= PLAIN_ENV[module.group(1)] | set(shared)
            continue
        fields = settings_class(module.group(1)).model_fields
        unknown = sorted(n for n in names if n.removeprefix(PREFIX).lower() not in fields)
        assert not unknown, f"{container['name']}: no settings field for {unknown}"
    assert {module_of(SERVICES[s]) for s in LONG_RUNNING} - {"services.agent"} <= modules
    for doc in docs:
        if doc["kind"] == "StatefulSet":  # a stable instance id is what fences a restarted replica
            env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
            instance = next(e for e in env if e["name"] == "GANGLINE_INSTANCE_ID")
            assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_k8s_mounts_the_example_queues_into_every_reader() -> None:
    docs = k8s_documents()
    [config] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gangline-queues"]
    document = yaml.safe_load(config["data"]["queues.yaml"])
    assert QueuesFile.model_validate(document) == QueuesFile.model_validate(
        yaml.safe_load(EXAMPLE_QUEUES.read_text())
    ), "deploy/k8s/config.yaml and deploy/docker/queues.yaml should carry the same queues"
    readers = set()
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert not RETIRED & set(env), container["name"]
            if "GANGLINE_QUEUES_FILE" not in env:
                continue
            readers.add(doc["metadata"]["name"])
            path = Path(env["GANGLINE_QUEUES_FILE"])
            [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
            assert volumes[mount["name"]]["configMap"]["name"] == "gangline-queues"
            assert path.name in config["data"]
    assert readers == set(READ_QUEUES)


def test_k8s_pods_carry_prometheus_scrape_annotations_for_their_metrics_port() -> None:
    workloads = [d for d in k8s_documents() if d["kind"] in ("Deployment", "StatefulSet")]
    assert workloads
    for doc in workloads:
        template = doc["spec"]["template"]
        [container] = template["spec"]["containers"]
        module = re.search(r"python -m ([\w.]+)", " ".join(container["command"]))
        assert module is not None
        port = METRICS_PORTS[module.group(1).split(".")[1]]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", doc["metadata"]["name"]
        assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (
            str(port),
            "/metrics",
        )
        assert {"name": "metrics", "containerPort": port} in container["ports"]


def _mounted_file(name: str, path: str) -> Path:
    """The host file compose puts at ``path`` in the service's container (a secret or a config)."""
    service = SERVICES[name]
    secrets = {f"/run/secrets/{s}": COMPOSE["secrets"][s]["file"] for s in service.get("secrets", [])}
    configs = {c["target"]: COMPOSE["configs"][c["source"]]["file"] for c in service.get("configs", [])}
    mounted = {**secrets, **configs}
    assert path in mounted, f"{name}: {path} is not mounted ({sorted(mounted)})"
    return ROOT / mounted[path]


@pytest.mark.parametrize(
    "name", ["admission", "quota", "placement", "preemption", "node-health", "ledger", "api"]
)
def test_every_service_checks_writers_with_the_access_file_and_the_master_key(name: str) -> None:
    from gangline.bus.trust import load_policy

    env = environment(SERVICES[name])
    access = _mounted_file(name, env["GANGLINE_TRUST_ACCESS"])
    key = _mounted_file(name, env["GANGLINE_TRUST_KEY_FILE"])
    tokens = _mounted_file(name, env["GANGLINE_TRUST_TOKENS_FILE"])
    assert access.resolve() == (ROOT / "deploy" / "kafka" / "access.yaml").resolve()
    assert load_policy(access, key, tokens).rules  # the files parse together (every tenant is known)


def test_the_simulated_nodes_sign_as_the_agent_with_its_derived_key_only() -> None:
    from gangline.bus.trust import WriterSigner, derive_key

    env = environment(SERVICES["fake-nodes"])
    assert not {k for k in env if k.startswith("GANGLINE_TRUST_")}, "an edge writer holds no master key"
    writer_key = _mounted_file("fake-nodes", env["GANGLINE_WRITER_KEY_FILE"])
    master = _mounted_file("admission", environment(SERVICES["admission"])["GANGLINE_TRUST_KEY_FILE"])
    signer = WriterSigner.from_env({**env, "GANGLINE_WRITER_KEY_FILE": str(writer_key)})
    assert signer is not None and signer.principal == "agent"
    assert signer.key == derive_key(master.read_bytes().strip(), "agent")
