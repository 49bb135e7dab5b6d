"""deploy/overlays/node-agent: the node agent's DaemonSet, its RBAC table and the admission policy.

The node agent needs the kubelet's sockets through hostPath, so it lives in its own namespace at the
privileged Pod Security level; everything else about it is as locked down as the other workloads. RBAC cannot
say "only your own Node", so a ValidatingAdmissionPolicy does (checked for real in the e2e tier).
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuwarden.cli import build_parser
from gpuwarden.config.root import Config
from tests.unit.test_deploy_manifests import expand, rules_of
from tests.unit.test_deploy_render import by_identity, rendered

OVERLAY = "overlays/node-agent"
NS = "gpuwarden-node"
SA = f"system:serviceaccount:{NS}:gpuwarden-node-agent"
NODE_AGENT_CLUSTER = {
    ("", "nodes", ""): "get list watch patch",
    ("", "pods", ""): "get list watch patch",
    ("events.k8s.io", "events", ""): "create patch",
}
HOST_PATHS = {
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/plugins_registry",  # read only: a DRA driver owning the GPUs withholds the plugin
    "/sys",
}
Obj = dict[str, Any]


def agent_objects() -> list[Obj]:
    return [o for o in rendered(OVERLAY) if o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            == "node-agent"]  # fmt: skip


def one(kind: str, name: str) -> Obj:
    found = [o for o in rendered(OVERLAY) if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_overlay_is_the_base_plus_the_node_agent() -> None:
    base = by_identity(rendered("base"))
    overlay = by_identity(rendered(OVERLAY))
    assert base.items() <= overlay.items()
    extra = {(k[1], k[3]) for k in overlay.keys() - base.keys()}
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    assert extra == {("Namespace", NS)} | {(k, "gpuwarden-node-agent") for k in kinds}


def test_labels_and_namespace() -> None:
    objs = agent_objects()
    assert len(objs) == 8
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gpuwarden"
        assert labels["app.kubernetes.io/part-of"] == "gpuwarden"
        assert labels["app.kubernetes.io/managed-by"] == "kustomize"
        cluster_scoped = obj["kind"] in {
            "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }  # fmt: skip
        assert obj["metadata"].get("namespace") == (None if cluster_scoped else NS), obj["metadata"]["name"]
    ns = one("Namespace", NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_daemonset_is_locked_down_except_for_the_kubelet_sockets() -> None:
    ds = one("DaemonSet", "gpuwarden-node-agent")
    pod = ds["spec"]["template"]["spec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pod["serviceAccountName"] == "gpuwarden-node-agent"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    host = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == HOST_PATHS
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    sys_volume = next(v["name"] for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/sys")
    assert mounts[sys_volume]["readOnly"] is True
    by_path = {v["hostPath"]["path"]: v["name"] for v in pod["volumes"] if "hostPath" in v}
    registry = by_path["/var/lib/kubelet/plugins_registry"]
    assert mounts[registry]["readOnly"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    args = build_parser().parse_args(c["args"])
    assert args.command == "node-agent" and str(args.config) == "/etc/gpuwarden/config.yaml"
    cm = one("ConfigMap", "gpuwarden-node-agent")
    config = Config.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert config.node_agent.listen.endswith(f":{ports['http']}")
    assert config.node_agent.pod_resources_path.startswith("/var/lib/kubelet/pod-resources/")
    assert config.node_agent.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert not config.node_agent.device_plugin.enabled, "observe mode by default (beside NVIDIA's plugin)"


def test_rbac_is_exactly_the_table() -> None:
    assert rules_of(one("ClusterRole", "gpuwarden-node-agent")) == expand(NODE_AGENT_CLUSTER)
    binding = one("ClusterRoleBinding", "gpuwarden-node-agent")
    assert binding["roleRef"]["name"] == "gpuwarden-node-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuwarden-node-agent", "namespace": NS}
    ]


def test_admission_policy_applies_to_the_agent_and_denies() -> None:
    policy = one("ValidatingAdmissionPolicy", "gpuwarden-node-agent")
    binding = one("ValidatingAdmissionPolicyBinding", "gpuwarden-node-agent")
    assert binding["spec"]["policyName"] == "gpuwarden-node-agent"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (cond,) = policy["spec"]["matchConditions"]
    assert SA in cond["expression"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {r for rule in rules for r in rule["resources"]} == {"nodes", "pods"}
    text = yaml.safe_dump(policy["spec"]["validations"])
    assert "authentication.kubernetes.io/node-name" in yaml.safe_dump(policy["spec"]["variables"])
    assert "gpuwarden.io/" in text and "oldObject.spec" in text
