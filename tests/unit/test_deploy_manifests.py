"""Structural checks of deploy/: file layout, labels, security, RBAC, wiring between objects, and the config.

Rendered with the small kustomize renderer of test_deploy_render.py (checked against real kustomize there
and in the e2e tier). The RBAC tables below are the least-privilege contract: a rule added to a ClusterRole
without a reason here fails, as does one removed while the code still needs it (the e2e tier proves the
table against the real API server).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import build_parser
from gpuwarden.config.loader import load_config
from gpuwarden.config.root import Config
from tests.unit.test_deploy_render import DEPLOY, OVERLAYS, ROOT, by_identity, rendered

Obj = dict[str, Any]
NAMESPACE = "gpuwarden"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}


def objects_of(overlay: str, kind: str) -> list[Obj]:
    return [o for o in rendered(overlay) if o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> Obj:
    found = [o for o in objects_of(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} in {overlay}: {len(found)} found"
    return found[0]


def config_of(overlay: str = "base") -> Config:
    cm = one(overlay, "ConfigMap", "gpuwarden-config")
    return Config.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))


def manifest_files() -> list[Path]:
    """The kustomize tree's object files (the Helm chart under deploy/helm is checked by test_helm_chart)."""
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml" and not p.is_relative_to(DEPLOY / "helm")
    )


# ------------------------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_one_resource_per_file_named_by_kind(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path}: {len(docs)} resources"
    kind = docs[0]["kind"].lower()
    assert path.stem == kind or path.stem.startswith(kind + "-"), f"{path.name} holds a {docs[0]['kind']}"


def test_every_manifest_file_is_used_by_a_kustomization() -> None:
    used: set[Path] = set()
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        for entry in yaml.safe_load(kfile.read_text()).get("resources", []):
            used.add((kfile.parent / entry).resolve())
    assert set(manifest_files()) <= used, sorted(str(p) for p in set(manifest_files()) - used)


@pytest.mark.parametrize("overlay", OVERLAYS[:4])
def test_standard_labels_everywhere(overlay: str) -> None:
    for obj in rendered(overlay):
        labels = obj["metadata"].get("labels", {})
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert labels.get("app.kubernetes.io/name") == "gpuwarden", where
        assert labels.get("app.kubernetes.io/part-of") == "gpuwarden", where
        assert labels.get("app.kubernetes.io/managed-by") == "kustomize", where
        if obj["kind"] != "Namespace":
            assert labels.get("app.kubernetes.io/component") in {
                "adapter",
                "controller",
                "scheduler",
                "monitoring",
                None,
            }, where


VAP_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # cluster-scoped


@pytest.mark.parametrize("overlay", OVERLAYS[:4])
def test_namespaced_objects_live_in_gpuwarden_except_the_auth_reader_bindings(overlay: str) -> None:
    for obj in rendered(overlay):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in {"Namespace", "ClusterRole", "ClusterRoleBinding", "APIService"} | VAP_KINDS:
            assert ns is None, obj["metadata"]["name"]
        elif obj["metadata"]["name"].endswith("-auth-reader"):
            assert ns == "kube-system"
        else:
            assert ns == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


# -------------------------------------------------------------------------------------------- workloads
@pytest.mark.parametrize("overlay", ["base", "overlays/scheduler"])
def test_workloads_are_locked_down(overlay: str) -> None:
    deployments = [o for o in rendered(overlay) if o["kind"] in WORKLOAD_KINDS]
    assert deployments
    for dep in deployments:
        name = dep["metadata"]["name"]
        pod = dep["spec"]["template"]["spec"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["serviceAccountName"], name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc.get("privileged") is False, name
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
            assert "memory" in c["resources"]["limits"], name
            image = c["image"]
            assert ":" in image and not image.endswith(":latest"), image
            ports = {p["name"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in c, f"{name}: no {probe}"
                assert c[probe]["httpGet"]["port"] in ports, f"{name}: {probe} on an unnamed port"
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{name}: a read-only root filesystem needs a writable /tmp"


def test_pod_security_restricted_namespace() -> None:
    ns = one("base", "Namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("overlay", ["base", "overlays/scheduler"])
def test_selectors_match_pod_templates(overlay: str) -> None:
    objs = rendered(overlay)
    templates = {
        o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
        for o in objs
        if o["kind"] == "Deployment"
    }
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        selector = dep["spec"]["selector"]["matchLabels"]
        assert selector.items() <= templates[dep["metadata"]["name"]].items()
    for kind, path in (
        ("Service", ("spec", "selector")),
        ("PodDisruptionBudget", ("spec", "selector", "matchLabels")),
    ):
        for obj in (o for o in objs if o["kind"] == kind):
            selector = obj
            for key in path:
                selector = selector[key]
            matching = [n for n, labels in templates.items() if selector.items() <= labels.items()]
            assert len(matching) == 1, f"{kind}/{obj['metadata']['name']} selects {matching}"


def test_every_deployment_has_a_pdb_and_two_replicas() -> None:
    objs = rendered("base")
    deployments = {o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"}
    pdbs = {o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    assert deployments == pdbs == {"gpuwarden-adapter", "gpuwarden-controller"}
    assert all(o["spec"]["replicas"] >= 2 for o in objs if o["kind"] == "Deployment")


@pytest.mark.parametrize("name", ["gpuwarden-adapter", "gpuwarden-controller"])
def test_container_args_are_a_valid_gpuwarden_command_line(name: str) -> None:
    container = one("base", "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.command == name.removeprefix("gpuwarden-")
    assert str(args.config) == "/etc/gpuwarden/config.yaml"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in one("base", "Deployment", name)["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/gpuwarden"]]["configMap"]["name"] == "gpuwarden-config"


def test_dockerfile_runs_as_the_deployments_user() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    user = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    assert user == [("65532", "65532")]
    assert 'ENTRYPOINT ["gpuwarden"]' in dockerfile
    # Runtime wheels only from the host-made wheelhouse, each checked against deploy/image/requirements.txt
    # (the runtime part of requirements.lock); every product package copied (tests/image checks the result).
    assert "PIP_NO_INDEX=1" in dockerfile and "--require-hashes" in dockerfile
    assert "/lock/requirements.txt" in dockerfile
    for package in ("gpuwarden", "adapter", "controller", "nodeagent"):
        assert f"COPY {package} ./{package}" in dockerfile
    for dep in objects_of("base", "Deployment"):
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532


# ------------------------------------------------------------------------------------------------ config
def test_config_is_valid_and_matches_the_ports() -> None:
    config = config_of()
    adapter = one("base", "Deployment", "gpuwarden-adapter")["spec"]["template"]["spec"]["containers"][0]
    controller = one("base", "Deployment", "gpuwarden-controller")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert adapter["ports"][0]["containerPort"] == config.adapter.secure_port
    assert controller["ports"][0]["containerPort"] == config.extender.port
    assert config.kubernetes.namespace == NAMESPACE
    assert config.adapter.authentication.enabled, "the adapter must authenticate in a cluster"
    assert config.kubernetes.leader_election.enabled
    role = one("base", "Role", "gpuwarden-controller")
    lease_names = {n for r in role["rules"] if "leases" in r["resources"] for n in r.get("resourceNames", [])}
    assert lease_names == {config.kubernetes.leader_election.lease_name}


def test_dry_run_overlay_only_adds_the_flag_and_claims_no_apiservice() -> None:
    """The doc's first command takes no metrics API from prometheus-adapter or KEDA (issue 46)."""
    base = by_identity(rendered("base"))
    dry = by_identity(rendered("overlays/dry-run"))
    assert {k for k in base if k[1] == "APIService"} == base.keys() - dry.keys()
    assert not [k for k in dry if k[1] == "APIService"]
    for key, obj in dry.items():
        obj = yaml.safe_load(yaml.safe_dump(obj))
        assert obj["metadata"]["labels"].pop("gpuwarden.io/mode") == "dry-run"
        if key[1:] == ("Deployment", NAMESPACE, "gpuwarden-controller"):
            args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[-1] == "--dry-run" and build_parser().parse_args(args).dry_run
            args.pop()
        assert obj == base[key], key


def test_the_shipped_bind_protocol_is_leader_and_claim_bind_only_switches_it(tmp_path: Path) -> None:
    base = by_identity(rendered("base"))
    claim = by_identity(rendered("overlays/claim-bind"))
    assert base.keys() == claim.keys()
    key = next(k for k in claim if k[1:] == ("Deployment", NAMESPACE, "gpuwarden-controller"))
    cm = one("base", "ConfigMap", "gpuwarden-config")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    protocols = {}
    for name, objects in (("base", base), ("claim-bind", claim)):
        container = objects[key]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        # POD_IP: what the Lease advertises
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        override = env["GPUWARDEN_EXTENDER__BIND_PROTOCOL"]
        loaded = load_config(tmp_path / "config.yaml", env={override["name"]: override["value"]})
        protocols[name] = loaded.extender.bind_protocol  # as the container's loader reads it
    assert protocols == {"base": "leader", "claim-bind": "claim"}
    container = claim[key]["spec"]["template"]["spec"]["containers"][0]
    for e in container["env"]:
        if e["name"] == "GPUWARDEN_EXTENDER__BIND_PROTOCOL":
            e["value"] = "leader"
    assert yaml.safe_load(yaml.safe_dump(claim[key])) == base[key]
    for k in claim.keys() - {key}:
        assert claim[k] == base[k], k


# -------------------------------------------------------------------------------------------------- RBAC
Rule = tuple[str, str, str, frozenset[str]]  # (group, resource, resourceName or "", verbs)


def rules_of(role: Obj) -> set[tuple[str, str, str, str]]:
    out = set()
    for rule in role["rules"]:
        for group in rule.get("apiGroups", [""]):
            for resource in rule.get("resources", rule.get("nonResourceURLs", [])):
                for name in rule.get("resourceNames", [""]):
                    for verb in rule["verbs"]:
                        out.add((group, resource, name, verb))
    return out


def expand(table: dict[tuple[str, str, str], str]) -> set[tuple[str, str, str, str]]:
    return {(g, r, n, v) for (g, r, n), verbs in table.items() for v in verbs.split()}


ADAPTER_CLUSTER = {
    ("", "pods", ""): "get list watch",
    ("", "nodes", ""): "get list watch",
    ("", "namespaces", ""): "get list watch",
}
CONTROLLER_CLUSTER = {
    ("", "nodes", ""): "get list watch patch",
    ("", "nodes/status", ""): "patch",
    ("", "pods", ""): "get list watch patch",
    ("", "pods/status", ""): "patch",
    ("", "pods/binding", ""): "create",
    ("", "pods/eviction", ""): "create",
    ("policy", "poddisruptionbudgets", ""): "list",
    ("", "namespaces", ""): "list watch",
    ("", "resourcequotas", ""): "list watch",
    ("apps", "replicasets", ""): "get",
    ("apps", "deployments/scale", ""): "get patch",
    ("apps", "statefulsets/scale", ""): "get patch",
    ("apps", "replicasets/scale", ""): "get patch",
    ("autoscaling", "horizontalpodautoscalers", ""): "list",
    ("", "events", ""): "list",
    ("events.k8s.io", "events", ""): "create patch list watch",
    ("topology.node.k8s.io", "noderesourcetopologies", ""): "list watch",
    ("resource.k8s.io", "deviceclasses", ""): "list watch",
    ("resource.k8s.io", "resourceslices", ""): "list watch",  # health: devices by UUID on DRA-backed nodes
    ("resource.k8s.io", "resourceclaims", ""): "get list",  # drain: which pods hold a faulty device
    ("resource.k8s.io", "devicetaintrules", ""): "create delete get list patch",  # health: ours only
}
CONTROLLER_NAMESPACE = {
    ("coordination.k8s.io", "leases", "gpuwarden-controller"): "get update",
    ("coordination.k8s.io", "leases", ""): "create",
    ("", "configmaps", "gpuwarden-quarantine-breaker"): "get patch",
    ("", "configmaps", ""): "create",
    ("batch", "jobs", ""): "create get list",  # health.validation's Jobs
}


def test_adapter_rbac_is_exactly_reads_plus_auth_delegation() -> None:
    assert rules_of(one("base", "ClusterRole", "gpuwarden-adapter")) == expand(ADAPTER_CLUSTER)
    delegator = one("base", "ClusterRoleBinding", "gpuwarden-adapter:system:auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    reader = one("base", "RoleBinding", "gpuwarden-adapter-auth-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }


def test_controller_rbac_is_exactly_the_table() -> None:
    assert rules_of(one("base", "ClusterRole", "gpuwarden-controller")) == expand(CONTROLLER_CLUSTER)
    assert rules_of(one("base", "Role", "gpuwarden-controller")) == expand(CONTROLLER_NAMESPACE)


@pytest.mark.parametrize("overlay", OVERLAYS[:4])
def test_no_wildcards_no_secrets_no_deletes_but_our_device_rules(overlay: str) -> None:
    for role in (o for o in rendered(overlay) if o["kind"] in {"ClusterRole", "Role"}):
        for group, resource, _name, verb in rules_of(role):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert resource != "secrets" and verb not in {"deletecollection", "escalate", "bind"}
            # The one delete: the health loop's own DeviceTaintRules, lifted with their quarantine (it lists
            # them by its managed-by label and deletes only those by name; docs/health.md).
            assert verb != "delete" or (group, resource) == ("resource.k8s.io", "devicetaintrules")


@pytest.mark.parametrize("overlay", OVERLAYS[:4])
def test_bindings_point_at_existing_subjects_and_roles(overlay: str) -> None:
    objs = rendered(overlay)
    accounts = {
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "ServiceAccount"
    }
    roles = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in {"Role", "ClusterRole"}}
    builtin = {
        ("ClusterRole", "system:auth-delegator"),
        ("ClusterRole", "system:kube-scheduler"),
        ("ClusterRole", "system:volume-scheduler"),
        ("Role", "extension-apiserver-authentication-reader"),
    }
    for binding in (o for o in objs if o["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
        ref = (binding["roleRef"]["kind"], binding["roleRef"]["name"])
        assert ref in roles | builtin, ref
        for subject in binding["subjects"]:
            if (subject["namespace"], subject["name"]) == ("monitoring", "prometheus-k8s"):
                continue  # the scraper's account, outside our install
            assert (subject["namespace"], subject["name"]) in accounts, subject
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        assert (NAMESPACE, dep["spec"]["template"]["spec"]["serviceAccountName"]) in accounts


# ----------------------------------------------------------------------------------------------- adapter
def test_apiservices_for_every_served_group_version() -> None:
    services = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects_of("base", "Service")}
    got = {}
    for api in objects_of("base", "APIService"):
        spec = api["spec"]
        assert api["metadata"]["name"] == f"{spec['version']}.{spec['group']}"
        svc = services[(spec["service"]["namespace"], spec["service"]["name"])]
        assert spec["service"]["port"] in {p["port"] for p in svc["spec"]["ports"]}
        assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "adapter"
        got[(spec["group"], spec["version"])] = spec["versionPriority"]
    assert got.keys() == {
        ("custom.metrics.k8s.io", "v1beta1"),
        ("custom.metrics.k8s.io", "v1beta2"),
        ("external.metrics.k8s.io", "v1beta1"),
    }
    assert got[("custom.metrics.k8s.io", "v1beta2")] > got[("custom.metrics.k8s.io", "v1beta1")]


def test_example_hpas_ask_for_metrics_the_adapter_serves() -> None:
    config = config_of()
    custom = {
        p.name for p in (config.adapter.presets.gpu_utilization, config.adapter.presets.requests_per_second)
    }
    external = {r.name.as_ for r in config.adapter.external_rules if r.name is not None}
    seen = set()
    for hpa in objects_of("examples", "HorizontalPodAutoscaler"):
        assert hpa["apiVersion"] == "autoscaling/v2"
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in custom
            else:
                assert metric["type"] == "External" and metric["external"]["metric"]["name"] in external
            seen.add(metric["type"])
    assert seen == {"Pods", "External"}


# --------------------------------------------------------------------------------------------- scheduler
def test_scheduler_overlay_calls_the_extender_as_docs_recommend() -> None:
    config = config_of("overlays/scheduler")
    cm = one("overlays/scheduler", "ConfigMap", "gpuwarden-scheduler-config")
    ksc = yaml.safe_load(cm["data"]["config.yaml"])
    assert (
        ksc["kind"] == "KubeSchedulerConfiguration" and ksc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    )
    assert [p["schedulerName"] for p in ksc["profiles"]] == ["gpuwarden-scheduler"]
    (ext,) = ksc["extenders"]
    svc = one("overlays/scheduler", "Service", "gpuwarden-controller")
    assert svc["spec"]["ports"][0]["port"] == config.extender.port
    assert ext["urlPrefix"] == f"http://gpuwarden-controller.{NAMESPACE}.svc:{config.extender.port}" + (
        config.extender.path_prefix
    )
    assert ext["enableHTTPS"] is (config.extender.tls.cert_file is not None)
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"], ext["bindVerb"]) == (
        "filter",
        "prioritize",
        "preempt",
        "bind",
    )
    assert ext["weight"] == 12 and ext["ignorable"] is False and ext["nodeCacheCapable"] is True
    assert ext["managedResources"] == [
        {"name": config.kubernetes.gpu_resource_name, "ignoredByScheduler": False}
    ]
    election = ksc["leaderElection"]
    role = one("overlays/scheduler", "Role", "gpuwarden-scheduler")
    assert election["resourceNamespace"] == NAMESPACE
    assert ("coordination.k8s.io", "leases", election["resourceName"], "update") in rules_of(role)
    dep = one("overlays/scheduler", "Deployment", "gpuwarden-scheduler")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert f"--config={mount['mountPath']}/config.yaml" in container["command"]


# -------------------------------------------------------------------------------------------- monitoring
def test_servicemonitors_select_services_and_ports() -> None:
    objs = rendered("overlays/monitoring")
    services = [o for o in objs if o["kind"] == "Service"]
    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"gpuwarden-adapter", "gpuwarden-controller"}
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        ports = {p["name"] for p in svc["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        # job label = Service name: the alerts' up{job="gpuwarden-adapter"} / {job="gpuwarden-controller"}
        assert svc["metadata"]["name"] == monitor["metadata"]["name"]
    reader = one("overlays/monitoring", "ClusterRole", "gpuwarden-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_alert_job_names_match_the_services() -> None:
    text = (ROOT / "rules" / "gpuwarden.rules.yaml").read_text()
    jobs = set(re.findall(r'job="(gpuwarden-[a-z]+)"', text))
    services = {o["metadata"]["name"] for o in objects_of("base", "Service")}
    assert jobs and jobs <= services
