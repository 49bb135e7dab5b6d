"""The chart installed beside what a GPU cluster already runs (issue 46): every piece switchable, observe
first, never an APIService taken over silently.

- `helm template` (the real helm binary): the adapter, each APIService, the KEDA scaler, each controller
  capability, the extender, the node agent and the scheduler switch on and off; `mode` (observe by default)
  and each capability's override land in the config the processes read; a combination that cannot work fails
  naming the value;
- against the test bed's real kube-apiserver (`helm template --dry-run=server`, which runs the chart's
  lookups): an APIService served by someone else fails the render naming its owner and the value to set;
  switched off it is left alone; `apiServices.takeOver` renders it with the displaced Service recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.config.root import Config
from harness.testbed import Cluster, ensure_namespace, poll
from tests.e2e.conftest import GPU_NODES, pod_manifest
from tests.e2e.test_deploy_dryrun import as_list, kubectl
from tests.e2e.test_helm_chart import CHART, helm, helm_binary, template, values_args

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
ADAPTER_KINDS = {"APIService"}
CUSTOM = {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"}
EXTERNAL = {"v1beta1.external.metrics.k8s.io"}
RESOURCE = {"v1beta1.metrics.k8s.io"}


def names(objects: Sequence[Obj], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["kind"] == kind}


def config_of(objects: Sequence[Obj], name: str = "gpuwarden-config") -> Config:
    cm = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name)
    return Config.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))


# ------------------------------------------------------------------------------------------- switches
@pytest.mark.parametrize(
    ("sets", "apiservices"),
    [
        pytest.param([], CUSTOM | EXTERNAL, id="defaults"),
        pytest.param(["keda.enabled=true"], CUSTOM, id="keda-owns-external"),
        pytest.param(["apiServices.externalMetrics.enabled=false"], CUSTOM, id="external-off"),
        pytest.param(["apiServices.customMetrics.enabled=false"], EXTERNAL, id="custom-off"),
        pytest.param(
            ["keda.enabled=true", "apiServices.externalMetrics.enabled=true"],
            CUSTOM | EXTERNAL,
            id="keda-and-ours",
        ),
        pytest.param(
            ["apiServices.customMetrics.enabled=false", "apiServices.externalMetrics.enabled=false"],
            set(),
            id="none",
        ),
        pytest.param(
            ["resourceMetrics.enabled=true", "resourceMetrics.kubePrometheusRules=true"],
            CUSTOM | EXTERNAL | RESOURCE,
            id="resource-metrics",
        ),
        pytest.param(["adapter.enabled=false"], set(), id="adapter-off"),
    ],
)
def test_each_apiservice_is_a_switch(sets: list[str], apiservices: set[str]) -> None:
    assert names(template(sets), "APIService") == apiservices


def test_adapter_off_leaves_no_adapter_object_and_the_rest_installs() -> None:
    objects = template(
        [
            "adapter.enabled=false",
            "nodeAgent.enabled=true",
            "scheduler.enabled=true",
            "monitoring.serviceMonitors.enabled=true",
            "monitoring.metricsReader.enabled=true",
        ]
    )
    adapter = [
        (o["kind"], o["metadata"]["name"])
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "adapter"
    ]
    assert adapter == []
    assert names(objects, "Deployment") == {"gpuwarden-controller", "gpuwarden-scheduler"}
    assert names(objects, "DaemonSet") == {"gpuwarden-node-agent"}
    assert names(objects, "ServiceMonitor") == {"gpuwarden-controller"}


def test_keda_scaler_is_a_switch() -> None:
    assert "gpuwarden-keda" in names(template(["keda.enabled=true"]), "Service")
    assert "gpuwarden-keda" not in names(template([]), "Service")


@pytest.mark.parametrize(
    ("sets", "present", "absent"),
    [
        pytest.param(
            [], {"gpuwarden-controller"}, {"gpuwarden-scheduler", "gpuwarden-node-agent"}, id="defaults"
        ),
        pytest.param(["controller.enabled=false"], set(), {"gpuwarden-controller"}, id="controller-off"),
        pytest.param(["scheduler.enabled=true"], {"gpuwarden-scheduler"}, set(), id="scheduler-on"),
        pytest.param(["nodeAgent.enabled=true"], {"gpuwarden-node-agent"}, set(), id="node-agent-on"),
    ],
)
def test_deployables_are_switches(sets: list[str], present: set[str], absent: set[str]) -> None:
    objects = template(sets)
    workloads = names(objects, "Deployment") | names(objects, "DaemonSet")
    assert present <= workloads and not absent & workloads


# --------------------------------------------------------------------------------------- observe first
SECTIONS = {  # capability value -> where its on/off and dry-run land in the config
    "health": ("health",),
    "nominations": ("nominations",),
    "preemptionThrottle": ("preemption",),
    "gpuPreemption": ("preemption", "make_room"),
    "drain": ("drain",),
    "idle": ("idle",),
}


def section(config: Config, path: tuple[str, ...]) -> Any:
    obj: Any = config
    for part in path:
        obj = getattr(obj, part)
    return obj


def all_on() -> list[str]:
    return [f"controller.capabilities.{name}.enabled=true" for name in SECTIONS]


@pytest.mark.parametrize(
    ("sets", "dry_run"),
    [
        pytest.param([], dict.fromkeys(SECTIONS, True), id="fresh-install-observes"),
        pytest.param(["mode=act"], dict.fromkeys(SECTIONS, False), id="act"),
        pytest.param(
            ["controller.capabilities.health.mode=act"],
            {**dict.fromkeys(SECTIONS, True), "health": False},
            id="observe-but-health-acts",
        ),
        pytest.param(
            ["mode=act", "controller.capabilities.drain.mode=observe"],
            {**dict.fromkeys(SECTIONS, False), "drain": True},
            id="act-but-drain-observes",
        ),
    ],
)
def test_mode_and_its_per_capability_override_reach_the_config(
    sets: list[str], dry_run: dict[str, bool]
) -> None:
    config = config_of(template([*all_on(), *sets]))
    assert {name: section(config, path).dry_run for name, path in SECTIONS.items()} == dry_run
    assert all(section(config, path).enabled for path in SECTIONS.values())


def test_the_node_agent_observes_unless_told() -> None:
    observe = config_of(template(["nodeAgent.enabled=true"]), "gpuwarden-node-agent")
    act = config_of(template(["nodeAgent.enabled=true", "mode=act"]), "gpuwarden-node-agent")
    own = config_of(template(["nodeAgent.enabled=true", "nodeAgent.mode=act"]), "gpuwarden-node-agent")
    assert (observe.node_agent.dry_run, act.node_agent.dry_run, own.node_agent.dry_run) == (
        True,
        False,
        False,
    )


@pytest.mark.parametrize("name", list(SECTIONS))
def test_each_capability_is_a_switch(name: str) -> None:
    on = config_of(template([f"controller.capabilities.{name}.enabled=true"]))
    off = config_of(template([f"controller.capabilities.{name}.enabled=false"]))
    assert section(on, SECTIONS[name]).enabled and not section(off, SECTIONS[name]).enabled


def test_the_extender_is_a_switch() -> None:
    assert config_of(template([])).extender.enabled
    assert not config_of(template(["controller.capabilities.extender.enabled=false"])).extender.enabled


def test_dry_run_flag_still_wins_over_act() -> None:
    objects = template(["controller.dryRun=true", "mode=act"])
    controller = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpuwarden-controller"
    )
    assert "--dry-run" in controller["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["adapter.enabled=false", "keda.enabled=true"],
            "keda.enabled: KEDA's scaler is served by the adapter",
        ),
        (
            ["adapter.enabled=false", "resourceMetrics.enabled=true", "rules.existing=cm"],
            "resourceMetrics.enabled: metrics.k8s.io is",
        ),
        (
            ["scheduler.enabled=true", "controller.capabilities.extender.enabled=false"],
            "scheduler.enabled: gpuwarden-scheduler calls the controller's extender",
        ),
        (
            ["controller.capabilities.drain.enabled=true", "controller.capabilities.health.enabled=false"],
            "controller.capabilities.drain.enabled",
        ),
        (["mode=enforce"], "at '/mode'"),
        (["controller.capabilities.health.mode=dry"], "at '/controller/capabilities/health/mode'"),
        (["controller.capabilities.heath.enabled=true"], "additional properties 'heath' not allowed"),
    ],
)
def test_a_combination_that_cannot_work_names_the_value(sets: list[str], message: str) -> None:
    done = helm("template", "gpuwarden", str(CHART), *values_args(sets))
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# ----------------------------------------------------------------------- lookups against the API server
FOREIGN = "v1beta1.external.metrics.k8s.io"


@pytest.fixture
def keda_owns_external(cluster: Cluster) -> Iterator[None]:
    """KEDA's APIService as KEDA's chart installs it (its Service need not exist: only the owner is read)."""
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": FOREIGN,
            "labels": {"app.kubernetes.io/name": "keda-operator-metrics-apiserver",
                       "app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "keda", "meta.helm.sh/release-namespace": "keda"},
        },
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "insecureSkipTLSVerify": True,
                 "service": {"name": "keda-operator-metrics-apiserver", "namespace": "keda", "port": 443}},
    }  # fmt: skip
    previous = kubectl(cluster, "get", "apiservice", FOREIGN, "-o", "json")
    done = kubectl(cluster, "apply", "-f", "-", input=json.dumps(apiservice))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        kubectl(cluster, "delete", "apiservice", FOREIGN, "--ignore-not-found")
        if previous.returncode == 0:  # another test's: put it back as it was
            restored = json.loads(previous.stdout)
            for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
                restored["metadata"].pop(key, None)
            restored.pop("status", None)
            kubectl(cluster, "apply", "-f", "-", input=json.dumps(restored))


def server_render(cluster: Cluster, sets: list[str]) -> Any:
    return helm("template", "gpuwarden", str(CHART), "-n", "gw-beside", "--dry-run=server",
                *values_args(sets), cluster=cluster)  # fmt: skip


def test_a_foreign_apiservice_is_refused_naming_owner_and_value(
    cluster: Cluster, keda_owns_external: None
) -> None:
    done = server_render(cluster, [])
    assert done.returncode != 0
    assert (
        f"APIService {FOREIGN} is served by Service keda/keda-operator-metrics-apiserver"
        " of Helm release keda/keda" in done.stderr
    ), done.stderr
    assert "set apiServices.externalMetrics.enabled=false" in done.stderr
    assert "apiServices.takeOver=true" in done.stderr


def test_switched_off_the_foreign_apiservice_is_left_alone(
    cluster: Cluster, keda_owns_external: None
) -> None:
    for sets in (
        ["apiServices.externalMetrics.enabled=false"],
        ["keda.enabled=true"],
        ["adapter.enabled=false"],
    ):
        done = server_render(cluster, sets)
        assert done.returncode == 0, done.stderr
        assert FOREIGN not in names([d for d in yaml.safe_load_all(done.stdout) if d], "APIService")


def test_take_over_records_the_displaced_service(cluster: Cluster, keda_owns_external: None) -> None:
    done = server_render(cluster, ["apiServices.takeOver=true"])
    assert done.returncode == 0, done.stderr
    ours = next(
        d
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "APIService" and d["metadata"]["name"] == FOREIGN
    )
    assert (
        ours["metadata"]["annotations"]["gpuwarden.io/displaced-service"]
        == "keda/keda-operator-metrics-apiserver"
    )
    assert ours["spec"]["service"]["name"] == "gpuwarden-adapter"


# ------------------------------------------------------------------------------- least privilege per feature
def controller_rules(sets: list[str]) -> set[tuple[str, str, str]]:
    found = set()
    for obj in template(sets):
        if obj["kind"] in ("ClusterRole", "Role") and obj["metadata"]["name"] == "gpuwarden-controller":
            for rule in obj["rules"]:
                for group in rule["apiGroups"]:
                    found |= {(group, r, v) for r in rule["resources"] for v in rule["verbs"]}
    return found


WRITES_OF_OPT_INS = {
    ("", "pods/eviction", "create"),
    ("apps", "deployments/scale", "patch"),
    ("batch", "jobs", "create"),
    ("resource.k8s.io", "resourceclaims", "get"),
}


def test_a_default_install_gets_no_right_of_an_opt_in_capability() -> None:
    assert not controller_rules([]) & WRITES_OF_OPT_INS
    assert controller_rules(["rbac.everyCapability=true"]) >= WRITES_OF_OPT_INS


@pytest.mark.parametrize(
    ("sets", "gained"),
    [
        pytest.param(
            ["controller.capabilities.idle.enabled=true"], ("apps", "deployments/scale", "patch"), id="idle"
        ),
        pytest.param(
            ["controller.capabilities.drain.enabled=true"], ("", "pods/eviction", "create"), id="drain"
        ),
        pytest.param(["config.health.validation.enabled=true"], ("batch", "jobs", "create"), id="validation"),
    ],
)
def test_switching_a_capability_on_grants_its_rights(sets: list[str], gained: tuple[str, str, str]) -> None:
    assert gained not in controller_rules([]) and gained in controller_rules(sets)


def test_switching_health_off_drops_its_node_and_device_writes() -> None:
    rules = controller_rules(["controller.capabilities.health.enabled=false"])
    assert ("", "nodes/status", "patch") not in rules
    assert ("resource.k8s.io", "devicetaintrules", "delete") not in rules
    assert ("", "nodes/status", "patch") in controller_rules([])


def test_the_rbac_table_of_the_docs_is_generated_from_the_chart() -> None:
    script = CHART.parents[1] / "rbac_table.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check", "--helm", str(helm_binary())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------- the controller's writes, fenced by admission
VAP_NS = "gw-vap"
CONTROLLER = f"system:serviceaccount:{VAP_NS}:gpuwarden-controller"
NODE = GPU_NODES[0]


@pytest.fixture(scope="module")
def fenced(cluster: Cluster) -> Iterator[None]:
    """The chart's controller RBAC and admission policies for real, the controller's user impersonated."""
    ensure_namespace(cluster, VAP_NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    objects = [
        o
        for o in template(["rbac.everyCapability=true"], namespace=VAP_NS)
        if o["metadata"]["name"].startswith("gpuwarden-controller")
        and o["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                          "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    ]  # fmt: skip
    assert {o["kind"] for o in objects} >= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    done = kubectl(cluster, "apply", "-f", "-", input=as_list(objects))
    assert done.returncode == 0, done.stderr
    # The policy is enforced once the API server has compiled it: a foreign annotation is refused. (A new
    # value each try: one accepted before that would make the next an unchanged, allowed key.)
    tries = iter(range(1_000_000))

    def refused() -> bool:
        probe = f"example.com/probe={next(tries)}"
        done = as_controller(cluster, "annotate", "node", NODE, probe, "--overwrite")
        return "may only change gpuwarden.io/ annotations" in done.stderr

    poll(refused, timeout=30, what="the admission policy enforced")
    kubectl(cluster, "annotate", "node", NODE, "example.com/probe-")  # a probe accepted before that
    try:
        yield
    finally:
        kubectl(cluster, "delete", "--ignore-not-found", "-f", "-", input=as_list(objects))
        kubectl(cluster, "annotate", "node", NODE, "example.com/probe-", "gpuwarden.io/probe-")
        untaint(cluster, NODE, "gpuwarden.io/gpu-unhealthy", "example.com/other")
        kubectl(cluster, "delete", "namespace", VAP_NS, "--ignore-not-found", "--wait=false")


def untaint(cluster: Cluster, node: str, *keys: str) -> None:
    """Remove each taint key that is there. One `kubectl taint` per key: given several, kubectl removes
    none when one of them is absent (a taint left on a shared node keeps later modules' pods pending)."""
    for key in keys:
        kubectl(cluster, "taint", "node", node, f"{key}-")


def as_controller(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl(cluster, f"--as={CONTROLLER}", *args)


def condition_patch(kind: str) -> str:
    now = "2026-12-07T00:00:00Z"
    return json.dumps({"status": {"conditions": [{"type": kind, "status": "True", "reason": "Probe",
                                                  "message": "", "lastHeartbeatTime": now,
                                                  "lastTransitionTime": now}]}})  # fmt: skip


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        pytest.param(
            ["annotate", "node", NODE, "gpuwarden.io/probe=1", "--overwrite"], None, id="our-annotation"
        ),
        pytest.param(
            ["annotate", "node", NODE, "example.com/probe=1"], "gpuwarden.io/ annotations", id="foreign-ann"
        ),
        pytest.param(
            ["label", "node", NODE, "example.com/probe=1"], "gpuwarden.io/ labels", id="foreign-label"
        ),
        pytest.param(
            ["taint", "node", NODE, "gpuwarden.io/gpu-unhealthy=xid:NoSchedule", "--overwrite"],
            None,
            id="our-taint",
        ),
        pytest.param(
            ["taint", "node", NODE, "example.com/other=x:NoSchedule"], "taints whose key", id="other-taint"
        ),
        pytest.param(["cordon", NODE], "never cordons", id="cordon"),
    ],
)
def test_the_controller_may_write_only_what_it_owns(
    cluster: Cluster, fenced: None, args: list[str], refusal: str | None
) -> None:
    done = as_controller(cluster, *args)
    if refusal is None:
        assert done.returncode == 0, done.stderr
    else:  # (kubectl cordon reports the refusal and exits 0)
        assert refusal in done.stderr, done.stderr
    assert not cluster.get_json("node", NODE)["spec"].get("unschedulable")


@pytest.mark.parametrize(
    ("condition", "refusal"),
    [
        pytest.param("GPUHealthy", None, id="our-condition"),
        pytest.param("Probe", "GPUHealthy, GPUDegraded and NVLinkDomainHealthy", id="other-condition"),
    ],
)
def test_the_controller_may_write_only_its_conditions(
    cluster: Cluster, fenced: None, condition: str, refusal: str | None
) -> None:
    """As the controller writes them: a strategic-merge PATCH of nodes/status (it has no `get` there)."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    api = k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig)))  # type: ignore[no-untyped-call]
    api.api_client.set_default_header("Impersonate-User", CONTROLLER)
    body = json.loads(condition_patch(condition))
    try:
        api.patch_node_status(NODE, body, _content_type="application/strategic-merge-patch+json")
    except k8s.ApiException as exc:
        assert refusal is not None and refusal in str(exc.body), exc.body
    else:
        assert refusal is None, f"{condition} was written"


def test_the_controller_may_not_change_a_pods_labels(cluster: Cluster, fenced: None, namespace: str) -> None:
    pod = pod_manifest("fenced")
    pod["metadata"]["namespace"] = namespace
    cluster.apply(pod)
    ours = as_controller(cluster, "annotate", "pod", "fenced", "-n", namespace, "gpuwarden.io/probe=1")
    assert ours.returncode == 0, ours.stderr
    theirs = as_controller(cluster, "label", "pod", "fenced", "-n", namespace, "app=other", "--overwrite")
    assert theirs.returncode != 0 and "gpuwarden.io/ labels of a pod" in theirs.stderr, theirs.stderr


# ------------------------------------------------------------------------------------- managed clusters
@pytest.mark.parametrize(
    ("kube_version", "sets", "image"),
    [
        pytest.param("v1.36.2", [], "registry.k8s.io/kube-scheduler:v1.36.2", id="follows-the-cluster"),
        pytest.param("v1.35.9-eks-1f2a", [], "registry.k8s.io/kube-scheduler:v1.35.9", id="managed-suffix"),
        pytest.param(
            "v1.36.2",
            ["scheduler.image=registry.k8s.io/kube-scheduler:v1.35.4"],
            "registry.k8s.io/kube-scheduler:v1.35.4",
            id="pinned",
        ),
    ],
)
def test_the_scheduler_image_follows_the_control_plane(
    kube_version: str, sets: list[str], image: str
) -> None:
    args = values_args(["scheduler.enabled=true", *sets])
    done = helm("template", "gpuwarden", str(CHART), "--kube-version", kube_version, *args)
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    scheduler = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpuwarden-scheduler"
    )
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["image"] == image


# ----------------------------------------------------------------------------------- gpuwarden uninstall
UNINSTALL_NS = "gw-uninstall"


def test_uninstall_lifts_ours_and_keeps_theirs(cluster: Cluster, tmp_path: Path) -> None:
    """`gpuwarden uninstall` (the hook's command) as a process against the real API server: our taint,
    condition, annotation and DeviceTaintRule go; the kubelet's conditions, others' taints and annotations and
    the operator's override stay."""
    node = GPU_NODES[1]
    ensure_namespace(cluster, UNINSTALL_NS, {})
    kubectl(cluster, "label", "node", node, "gpuwarden.io/exclude=true", "--overwrite")
    kubectl(
        cluster, "annotate", "node", node, "gpuwarden.io/quarantine={}", "example.com/theirs=1", "--overwrite"
    )
    kubectl(cluster, "taint", "node", node, "gpuwarden.io/gpu-unhealthy=xid-79:NoSchedule", "--overwrite")
    kubectl(cluster, "taint", "node", node, "example.com/theirs=1:NoSchedule", "--overwrite")
    now = "2026-12-07T00:00:00Z"
    condition = {"type": "GPUHealthy", "status": "False", "reason": "Xid79", "message": "",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    done = kubectl(cluster, "patch", "node", node, "--subresource=status", "--type=strategic",
                   "-p", json.dumps({"status": {"conditions": [condition]}}))  # fmt: skip
    assert done.returncode == 0, done.stderr
    taint = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    rules = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
         "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": manager}},
         "spec": {"deviceSelector": {"driver": "gpu.example.com", "pool": node, "device": "gpu-0"},
                  "taint": taint}}
        for name, manager in (("gpuwarden-e2e-ours", "gpuwarden"), ("driver-e2e-theirs", "dra-driver"))
    ]  # fmt: skip
    done = kubectl(cluster, "apply", "-f", "-", input=as_list(rules))
    assert done.returncode == 0, done.stderr
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"kubernetes": {"namespace": UNINSTALL_NS}}))
    topology = {
        n["metadata"]["name"]: n["metadata"]["annotations"]["gpuwarden.io/gpu-topology"]
        for n in json.loads(kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
        if "gpuwarden.io/gpu-topology" in n["metadata"].get("annotations", {})
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "uninstall", "--config", str(config),
             "--kubeconfig", str(cluster.kubeconfig), "--keep-running"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        line = next(x for x in proc.stdout.splitlines() if x.strip().startswith(f"Node {node}:"))
        assert "taint gpuwarden.io/gpu-unhealthy" in line and "condition GPUHealthy" in line, line
        after = json.loads(kubectl(cluster, "get", "node", node, "-o", "json").stdout)
        annotations = after["metadata"]["annotations"]
        assert "gpuwarden.io/quarantine" not in annotations and annotations["example.com/theirs"] == "1"
        assert [t["key"] for t in after["spec"]["taints"]] == ["example.com/theirs"]
        types = {c["type"] for c in after["status"]["conditions"]}
        assert "GPUHealthy" not in types and "Ready" in types
        assert after["metadata"]["labels"]["gpuwarden.io/exclude"] == "true"
        left = kubectl(cluster, "get", "devicetaintrules", "-o", "name").stdout
        assert "driver-e2e-theirs" in left and "gpuwarden-e2e-ours" not in left, left
    finally:
        kubectl(cluster, "label", "node", node, "gpuwarden.io/exclude-")
        kubectl(cluster, "annotate", "node", node, "example.com/theirs-", "gpuwarden.io/quarantine-")
        untaint(cluster, node, "example.com/theirs", "gpuwarden.io/gpu-unhealthy")
        for name in ("gpuwarden-e2e-ours", "driver-e2e-theirs"):
            kubectl(cluster, "delete", "devicetaintrule", name, "--ignore-not-found")
        for name, value in topology.items():  # the test bed's, lifted too: other tests place GPUs by it
            kubectl(cluster, "annotate", "node", name, f"gpuwarden.io/gpu-topology={value}", "--overwrite")
        kubectl(cluster, "delete", "namespace", UNINSTALL_NS, "--ignore-not-found", "--wait=false")


# ----------------------------------------------------------------------------------- kube-prometheus-stack
PROFILE = CHART / "profiles" / "kube-prometheus-stack.yaml"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_the_kube_prometheus_stack_profile_labels_every_monitoring_object() -> None:
    objects = template(["nodeAgent.enabled=true"], [PROFILE])
    monitoring = [
        o
        for o in objects
        if o["kind"] in MONITORING_KINDS or "grafana_dashboard" in o["metadata"].get("labels", {})
    ]
    kinds = {o["kind"] for o in monitoring}
    assert kinds == MONITORING_KINDS | {"ConfigMap"}, kinds
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in monitoring)
    assert (
        str(config_of(objects).prometheus.url)
        == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090/"
    )
    pod_monitor = next(o for o in monitoring if o["kind"] == "PodMonitor")
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    selector = pod_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"] for p in daemonset["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    assert pod_monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]


def test_no_labels_of_the_stack_without_the_profile() -> None:
    objects = template(["monitoring.serviceMonitors.enabled=true", "monitoring.prometheusRule.enabled=true"])
    assert not [o for o in objects if "release" in o["metadata"].get("labels", {})]


def test_every_pod_of_the_chart_turns_service_links_off() -> None:
    """tests/unit/test_deploy_service_links.py says why; the chart's hook Job is a pod of ours too."""
    objects = template(["nodeAgent.enabled=true", "scheduler.enabled=true"])
    pods = {
        (o["kind"], o["metadata"]["name"]): o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in {"Deployment", "DaemonSet", "Job"}
    }
    assert ("Job", "gpuwarden-uninstall") in pods
    gpuwarden_pods = {
        k: v for k, v in pods.items() if k[1] != "gpuwarden-scheduler"
    }  # kube-scheduler: not ours
    assert {k: v.get("enableServiceLinks") for k, v in gpuwarden_pods.items()} == dict.fromkeys(
        gpuwarden_pods, False
    )


def test_the_route_policy_is_rendered_only_where_the_api_serves_it(cluster: Cluster) -> None:
    """The MutatingAdmissionPolicy that routes GPU pods of opted-in namespaces: rendered when the API serves
    admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, and against the test bed's kube-apiserver (which
    does not serve it) not at all - there, workloads set schedulerName themselves (docs/install.md)."""
    served = "MutatingAdmissionPolicy" in kubectl(cluster, "api-resources", "-o", "name").stdout
    done = server_render(cluster, ["scheduler.enabled=true"])
    assert done.returncode == 0, done.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(done.stdout) if d}
    assert ("MutatingAdmissionPolicy" in kinds) == served
    api = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
    rendered = helm("template", "gpuwarden", str(CHART), *api, *values_args(["scheduler.enabled=true"]))
    route = [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "MutatingAdmissionPolicy"]
    assert len(route) == 1
    spec = route[0]["spec"]
    assert spec["matchConstraints"]["namespaceSelector"]["matchLabels"] == {"gpuwarden.io/scheduler": "true"}
    assert spec["failurePolicy"] == "Ignore"
    assert "gpuwarden-scheduler" in spec["mutations"][0]["applyConfiguration"]["expression"]
