"""deploy/overlays/keda: the base without the external.metrics APIService, with the KEDA external scaler on.

The rendered Deployment's environment and the base ConfigMap are loaded the way the pod loads them, so the
port the Service targets is the port the adapter really listens on.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.config.loader import load_config
from tests.unit.test_deploy_manifests import objects_of, one
from tests.unit.test_deploy_render import by_identity, identity, rendered

OVERLAY = "overlays/keda"


def test_overlay_is_the_base_minus_the_external_apiservice_plus_the_keda_service() -> None:
    base = by_identity(rendered("base"))
    keda = by_identity(rendered(OVERLAY))
    removed = set(base) - set(keda)
    added = set(keda) - set(base)
    assert removed == {("apiregistration.k8s.io/v1", "APIService", "", "v1beta1.external.metrics.k8s.io")}
    assert added == {("v1", "Service", "gpuwarden", "gpuwarden-keda")}
    groups = {a["spec"]["group"] for a in objects_of(OVERLAY, "APIService")}
    assert groups == {"custom.metrics.k8s.io"}, "custom.metrics stays ours; KEDA never registers it"
    changed = {k for k in keda if k in base and keda[k] != base[k]}
    assert changed == {("apps/v1", "Deployment", "gpuwarden", "gpuwarden-adapter")}


def test_adapter_serves_keda_on_the_port_the_service_targets(tmp_path: Path) -> None:
    dep = one(OVERLAY, "Deployment", "gpuwarden-adapter")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    cm = one(OVERLAY, "ConfigMap", "gpuwarden-config")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cm["data"]["config.yaml"])
    config = load_config(config_file, env=env)
    assert config.adapter.keda.enabled
    assert not config.adapter.keda.tls.plaintext, "the gRPC port must not default to plaintext in a cluster"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == config.adapter.keda.port
    svc = one(OVERLAY, "Service", "gpuwarden-keda")
    assert svc["spec"]["ports"] == [
        {
            "name": "grpc",
            "port": config.adapter.keda.port,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "grpc",
        }
    ]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_every_object_keeps_the_standard_labels() -> None:
    for obj in rendered(OVERLAY):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "gpuwarden", identity(obj)
        assert labels["app.kubernetes.io/name"] == "gpuwarden", identity(obj)
