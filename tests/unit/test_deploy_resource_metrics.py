"""deploy/overlays/resource-metrics: the APIService v1beta1.metrics.k8s.io on the adapter's Service, the
reader role aggregated into view/edit/admin, and the adapter reading kube-prometheus's resourceRules as its
`rules_file` - loaded here through the same loader, env override and compiler the adapter runs at start.
"""

from __future__ import annotations

from pathlib import Path

from adapter.resource_rules import compile_resource_rules
from gpuwarden.config.loader import load_config
from tests.unit.test_deploy_manifests import one, rendered

OVERLAY = "overlays/resource-metrics"
GOLDEN = Path(__file__).parent / "golden/adapter/resource/kube-prometheus-config.yaml"


def test_apiservice_points_at_the_adapter() -> None:
    api = one(OVERLAY, "APIService", "v1beta1.metrics.k8s.io")
    spec = api["spec"]
    assert (spec["group"], spec["version"]) == ("metrics.k8s.io", "v1beta1")
    svc = one(OVERLAY, "Service", spec["service"]["name"])
    assert svc["metadata"]["namespace"] == spec["service"]["namespace"]
    assert spec["service"]["port"] in {p["port"] for p in svc["spec"]["ports"]}
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "adapter"


def test_reader_role_is_aggregated_and_read_only() -> None:
    role = one(OVERLAY, "ClusterRole", "gpuwarden-aggregated-metrics-reader")
    labels = role["metadata"]["labels"]
    for target in ("view", "edit", "admin"):
        assert labels[f"rbac.authorization.k8s.io/aggregate-to-{target}"] == "true"
    assert role["rules"] == [
        {"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}
    ]


def test_adapter_loads_the_resource_rules_it_mounts(tmp_path: Path) -> None:
    dep = one(OVERLAY, "Deployment", "gpuwarden-adapter")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "resource-rules")
    volume = next(v for v in pod["volumes"] if v["name"] == "resource-rules")
    cm = one(OVERLAY, "ConfigMap", volume["configMap"]["name"])
    rules_file = Path(env["GPUWARDEN_ADAPTER__RULES_FILE"])
    assert rules_file.parent == Path(mount["mountPath"]) and rules_file.name in cm["data"]
    assert cm["data"][rules_file.name].strip() == GOLDEN.read_text().strip()  # kube-prometheus's, unchanged
    (tmp_path / "rules.yaml").write_text(cm["data"][rules_file.name])
    (tmp_path / "config.yaml").write_text(
        one(OVERLAY, "ConfigMap", "gpuwarden-config")["data"]["config.yaml"]
    )
    config = load_config(
        tmp_path / "config.yaml", env={"GPUWARDEN_ADAPTER__RULES_FILE": str(tmp_path / "rules.yaml")}
    )
    assert config.adapter.resource_rules is not None
    compiled = compile_resource_rules(config.adapter.resource_rules)
    assert (compiled.cpu.node_label, compiled.memory.node_label) == ("node", "instance")


def test_base_does_not_take_metrics_k8s_io() -> None:
    names = {o["metadata"]["name"] for o in rendered("base") if o["kind"] == "APIService"}
    assert "v1beta1.metrics.k8s.io" not in names
