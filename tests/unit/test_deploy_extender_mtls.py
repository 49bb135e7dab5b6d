"""deploy/overlays/extender-mtls and the controller's NetworkPolicy (issue 44): the controller reads its
serving pair and client CA from the mounted Secret (the config it loads, with the overlay's environment,
names files under the mount), probes over HTTPS, and kube-scheduler's extender tlsConfig names files of its
own mounted Secret with HTTPS to the controller's Service; the NetworkPolicy selects the controller's pods,
opens only its named port, and admits the scheduler's and the controller's pods and Prometheus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuwarden.config.loader import load_config
from tests.unit.test_deploy_manifests import NAMESPACE, one

OVERLAY = "overlays/extender-mtls"


def mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Mount path -> the Secret mounted there."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    return {m["mountPath"]: secrets[m["name"]] for m in container["volumeMounts"] if m["name"] in secrets}


def under(path: str, mount: dict[str, str], secret: str) -> bool:
    return any(path.startswith(p.rstrip("/") + "/") and s == secret for p, s in mount.items())


def test_the_controller_serves_the_mounted_pair_and_trusts_the_mounted_ca(tmp_path: Path) -> None:
    deployment = one(OVERLAY, "Deployment", "gpuwarden-controller")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    cm = one(OVERLAY, "ConfigMap", "gpuwarden-config")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    tls = load_config(tmp_path / "config.yaml", env=env).extender.tls
    assert tls.client_auth_required()
    mount = mounts(pod, container)
    for path in (tls.cert_file, tls.key_file, tls.client_ca_file):
        assert under(str(path), mount, "gpuwarden-extender-tls"), path
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_the_scheduler_calls_the_service_over_https_with_its_client_certificate() -> None:
    cm = one(OVERLAY, "ConfigMap", "gpuwarden-scheduler-config")
    (extender,) = yaml.safe_load(cm["data"]["config.yaml"])["extenders"]
    assert extender["urlPrefix"] == f"https://gpuwarden-controller.{NAMESPACE}.svc:8888/gpuwarden"
    assert extender["enableHTTPS"] is True
    deployment = one(OVERLAY, "Deployment", "gpuwarden-scheduler")
    pod = deployment["spec"]["template"]["spec"]
    mount = mounts(pod, pod["containers"][0])
    for key in ("caFile", "certFile", "keyFile"):
        assert under(extender["tlsConfig"][key], mount, "gpuwarden-scheduler-extender"), key
    plain = yaml.safe_load(
        one("overlays/scheduler", "ConfigMap", "gpuwarden-scheduler-config")["data"]["config.yaml"]
    )
    (before,) = plain["extenders"]
    changed = {k for k in extender.keys() | before.keys() if extender.get(k) != before.get(k)}
    assert changed == {"urlPrefix", "enableHTTPS", "tlsConfig"}  # nothing else moved


def test_the_network_policy_admits_only_the_scheduler_the_replicas_and_prometheus() -> None:
    policy = one("base", "NetworkPolicy", "gpuwarden-controller")
    deployment = one("base", "Deployment", "gpuwarden-controller")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["http"] and "http" in ports
    peers = [(p.get("namespaceSelector"), p["podSelector"]["matchLabels"]) for p in rule["from"]]
    scheduler = one("overlays/scheduler", "Deployment", "gpuwarden-scheduler")
    assert (
        None,
        {"app.kubernetes.io/name": "gpuwarden", "app.kubernetes.io/component": "scheduler"},
    ) in peers
    assert peers[0][1].items() <= scheduler["spec"]["template"]["metadata"]["labels"].items()
    assert (None, policy["spec"]["podSelector"]["matchLabels"]) in peers  # the replicas (bind/forwarded)
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert (monitoring, {"app.kubernetes.io/name": "prometheus"}) in peers
    assert len(peers) == 3
