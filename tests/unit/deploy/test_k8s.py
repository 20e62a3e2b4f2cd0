"""deploy/k8s validated offline: `kubectl kustomize` output checked by kubeconform against the Kubernetes and
CRD schemas kept in deploy/k8s/schemas (deploy/k8s/validate.sh), and a broken copy of it refused; then what
the manifests must say that no schema checks (probes, the agent's GPU access, the trust keys, the pools)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gangline.agent.settings import NodeAgentSettings
from gangline.core.pools import PoolLayout
from services.common.pools import home_pools
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
VALIDATE = K8S / "validate.sh"
KUBECONFORM = Path(os.environ.get("KUBECONFORM", ROOT / ".cache" / "bin" / "kubeconform"))
KUBECTL = shutil.which(os.environ.get("KUBECTL", "kubectl"))

needs_tools = pytest.mark.skipif(
    not KUBECONFORM.is_file() or KUBECTL is None,
    reason="kubeconform (make k8s-tools; make test builds it) or kubectl missing",
)


def validate(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VALIDATE), str(directory)],
        env={**os.environ, "KUBECONFORM": str(KUBECONFORM)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def rendered() -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@needs_tools
def test_the_manifests_are_valid_against_the_kept_schemas() -> None:
    done = validate(K8S)
    assert done.returncode == 0, done.stdout + done.stderr
    docs = rendered()
    # Every resource was checked (none skipped), the operators' resources included.
    assert f"{len(docs)} resources found" in done.stdout and "Skipped: 0" in done.stdout
    kinds = {d["kind"] for d in docs}
    assert {
        "Kafka",
        "KafkaNodePool",
        "KafkaTopic",
        "KafkaUser",
        "Cluster",
        "DaemonSet",
        "StatefulSet",
    } <= kinds


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _rewrite(path: Path, change: Callable[[list[dict[str, Any]]], None]) -> None:
    docs = _yaml_docs(path)
    change(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _first(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def _typo_in_a_deployment(docs: list[dict[str, Any]]) -> None:
    spec = _first(docs, "Deployment")["spec"]
    spec["replicaz"] = spec.pop("replicas")


def _port_as_words(docs: list[dict[str, Any]]) -> None:
    container = _first(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    container["ports"][0]["containerPort"] = "nine thousand"


def _topic_without_partitions_count(docs: list[dict[str, Any]]) -> None:
    _first(docs, "KafkaTopic")["spec"]["partitions"] = "three"


def _acl_operation_unknown(docs: list[dict[str, Any]]) -> None:
    user = next(d for d in docs if d["kind"] == "KafkaUser" and "authorization" in d["spec"])
    user["spec"]["authorization"]["acls"][0]["operations"] = ["Fly"]


def _postgres_field_unknown(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Cluster")["spec"]["replicas"] = 3  # CloudNativePG says instances


def _daemonset_probe_misnamed(docs: list[dict[str, Any]]) -> None:
    container = _first(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")


BREAKAGES = {  # what breaks, in which file of the copy
    "a field typo in a Deployment": ("edge-services.yaml", _typo_in_a_deployment),
    "a port in words": ("decision-services.yaml", _port_as_words),
    "a KafkaTopic's partitions in words": ("kafka.yaml", _topic_without_partitions_count),
    "an ACL operation Kafka lacks": ("kafka.yaml", _acl_operation_unknown),
    "a CloudNativePG field that is not": ("postgres.yaml", _postgres_field_unknown),
    "a misspelt probe in the DaemonSet": ("agent.yaml", _daemonset_probe_misnamed),
}


@needs_tools
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_copy_of_the_manifests_is_refused(tmp_path: Path, breakage: str) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("schemas"))  # validate.sh reads the kept ones
    file, change = BREAKAGES[breakage]
    _rewrite(copy / file, change)
    done = validate(copy)
    assert done.returncode != 0, done.stdout
    assert "Invalid: 1" in done.stdout, done.stdout


@needs_tools
def test_a_kind_without_a_kept_schema_is_an_error_not_a_skip(tmp_path: Path) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("schemas"))
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"}, "spec": {}}
    (copy / "claim.yaml").write_text(yaml.safe_dump(claim))
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
    kustomization["resources"].append("claim.yaml")
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    done = validate(copy)
    assert done.returncode != 0
    assert "could not find schema for PersistentVolumeClaim" in done.stdout


# -- what the schemas cannot say ---------------------------------------------------------------------


DECISION_SERVICES = ("admission", "quota", "placement", "preemption", "node-health")


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    [container] = doc["spec"]["template"]["spec"]["containers"]
    return container


@needs_tools
def test_every_service_has_liveness_and_readiness_probes_on_its_metrics_server() -> None:
    docs = rendered()
    workloads = {**by_kind(docs, "StatefulSet"), **by_kind(docs, "Deployment"), **by_kind(docs, "DaemonSet")}
    for name in (*DECISION_SERVICES, "ledger", "node-agent"):
        container = _container(workloads[name])
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name
    api = _container(workloads["api"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "livenessProbe" in _container(workloads["analytics"])


@needs_tools
def test_the_node_agent_runs_on_every_gpu_node_with_nvml_access() -> None:
    [agent] = by_kind(rendered(), "DaemonSet").values()
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    container = _container(agent)
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"]  # NVML is a utility capability
    # It takes no GPU from the device plugin: the ranks it launches need them all.
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    assert env["GANGLINE_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "services.agent.real" in " ".join(container["command"])
    # What it is told, the agent's settings read (the topology file adds leaf, spine, nvlink domain).
    fields = set(NodeAgentSettings.model_fields)
    gangline = {n.removeprefix("GANGLINE_").lower() for n in env if n.startswith("GANGLINE_")}
    security = {"kafka_username", "kafka_password", "writer_key_file"}  # gangline.bus.security, .trust
    assert gangline - security <= fields, gangline - security - fields
    required = {n for n, f in NodeAgentSettings.model_fields.items() if f.is_required()}
    assert required - gangline == {"leaf", "spine"}
    init = pod["initContainers"][0]["command"][-1]
    assert all(f"GANGLINE_{n.upper()}" in init for n in ("leaf", "spine", "nvlink_domain"))


@needs_tools
def test_the_trust_keys_are_secrets_mounted_where_the_services_look() -> None:
    docs = rendered()
    workloads = {**by_kind(docs, "StatefulSet"), **by_kind(docs, "Deployment"), **by_kind(docs, "DaemonSet")}
    for name in (*DECISION_SERVICES, "ledger", "api", "node-agent"):
        pod = workloads[name]["spec"]["template"]["spec"]
        container = _container(workloads[name])
        env = {e["name"]: e.get("value") for e in container["env"]}
        key_file = (
            env.get("GANGLINE_WRITER_KEY_FILE") if name == "node-agent" else env["GANGLINE_TRUST_KEY_FILE"]
        )
        assert key_file is not None, name
        if name == "node-agent":
            assert "GANGLINE_TRUST_KEY_FILE" not in env  # an edge writer holds no master key
        [mount] = [m for m in container["volumeMounts"] if Path(key_file).parent == Path(m["mountPath"])]
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == (
            "gangline-agent-key" if name == "node-agent" else "gangline-trust"
        )
        if name != "node-agent":
            [access] = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/gangline/access"]
            [access_volume] = [v for v in pod["volumes"] if v["name"] == access["name"]]
            assert access_volume["configMap"]["name"] == "gangline-access"


@needs_tools
def test_placement_pools_are_statefulset_replicas_with_stable_ids() -> None:
    docs = rendered()
    placement = by_kind(docs, "StatefulSet")["placement"]
    assert placement["spec"]["podManagementPolicy"] == "Parallel"
    env = {e["name"]: e for e in _container(placement)["env"]}
    assert env["GANGLINE_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # One replica per pool group: the pools are dealt over the ordinals (services/common/pools.py).
    replicas = placement["spec"]["replicas"]
    assert replicas >= 2 and int(env["GANGLINE_POOL_REPLICAS"]["value"]) == replicas
    layout = PoolLayout.parse(by_kind(docs, "ConfigMap")["gangline-env"]["data"]["GANGLINE_POOLS"])
    groups = [
        home_pools(layout, group=None, instance_id=f"placement-{i}", replicas=replicas)
        for i in range(replicas)
    ]
    assert all(groups) and set().union(*groups) == set(layout.pools)
    # Every pooled topic has a partition per pool.
    topics = {t["spec"]["topicName"]: t["spec"]["partitions"] for t in by_kind(docs, "KafkaTopic").values()}
    for name in TopicNames().pooled():
        layout.check_partitions(topics[name], name)
