"""`helm install` beside KEDA for real (issue 46): refused naming the owner, installed without the adapter,
`mode=act` by one upgrade, `helm rollback`, `helm uninstall` leaving no cluster-scoped object.

A module of its own: test_helm_beside's module-scoped fixtures hold objects of the same fixed names
(ClusterRole gpuwarden-controller) until that module ends, and Helm refuses to adopt them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import yaml

from gpuwarden.config.root import Config
from harness.testbed import Cluster, ensure_namespace
from tests.e2e.test_deploy_dryrun import kubectl
from tests.e2e.test_helm_beside import FOREIGN, keda_owns_external
from tests.e2e.test_helm_chart import CHART, helm, values_args

pytestmark = pytest.mark.e2e
__all__ = ["keda_owns_external"]  # the fixture, used by name

BESIDE_NS = "gw-beside"
STEPS: dict[str, float] = {}
"""Seconds each step of docs/install.md's walkthrough took on the test bed (printed; docs/install.md)."""


def timed(step: str, run: Callable[[], subprocess.CompletedProcess[str]]) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    done = run()
    STEPS[step] = round(time.monotonic() - t0, 2)
    return done


def configmap_modes(cluster: Cluster) -> bool:
    """health.dry_run of the installed config (True: observe)."""
    cm = json.loads(
        kubectl(cluster, "get", "configmap", "gpuwarden-config", "-n", BESIDE_NS, "-o", "json").stdout
    )
    return bool(Config.model_validate(yaml.safe_load(cm["data"]["config.yaml"])).health.dry_run)


def test_helm_install_beside_keda_refuses_then_installs_without_the_adapter_and_rolls_back(
    cluster: Cluster, keda_owns_external: None
) -> None:
    """`helm install` for real: refused while KEDA owns external.metrics (naming it); with
    adapter.enabled=false it installs the controller observing and KEDA's APIService is untouched;
    `--set mode=act` is one upgrade and `helm rollback` brings observe back. (Pods land on kwok nodes: the
    objects are what is tested here; tests/e2e/test_installed_image.py runs the image.)"""
    ensure_namespace(cluster, BESIDE_NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    before = json.loads(kubectl(cluster, "get", "apiservice", FOREIGN, "-o", "json").stdout)["spec"]
    base = ["uninstallHook.enabled=false"]  # kwok pods never complete a hook Job
    try:
        refused = timed("helm install, refused (KEDA owns external.metrics)", lambda: helm(
            "install", "gpuwarden", str(CHART), "-n", BESIDE_NS, *values_args(base), cluster=cluster
        ))  # fmt: skip
        assert refused.returncode != 0
        assert "served by Service keda/keda-operator-metrics-apiserver" in refused.stderr, refused.stderr
        sets = [
            *base,
            "adapter.enabled=false",
            "nodeAgent.enabled=true",
            f"nodeAgent.namespace={BESIDE_NS}-node",
        ]
        done = timed("helm install, adapter off (observe)", lambda: helm(
            "install", "gpuwarden", str(CHART), "-n", BESIDE_NS, *values_args(sets), cluster=cluster
        ))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "The adapter is off" in done.stdout and "health: observe" in done.stdout, done.stdout
        assert configmap_modes(cluster) is True
        after = json.loads(kubectl(cluster, "get", "apiservice", FOREIGN, "-o", "json").stdout)["spec"]
        assert after == before
        act = ["--reuse-values", "--set", "mode=act"]
        upgraded = timed("helm upgrade --set mode=act", lambda: helm(
            "upgrade", "gpuwarden", str(CHART), "-n", BESIDE_NS, *act, cluster=cluster
        ))  # fmt: skip
        assert upgraded.returncode == 0, upgraded.stderr
        assert configmap_modes(cluster) is False
        rolled = timed("helm rollback to observe", lambda: helm(
            "rollback", "gpuwarden", "1", "-n", BESIDE_NS, cluster=cluster
        ))  # fmt: skip
        assert rolled.returncode == 0, rolled.stderr
        assert configmap_modes(cluster) is True
    finally:
        # (no --wait: what is checked below is cluster-scoped; kwok's pods in the namespaces go when they go)
        gone = timed(
            "helm uninstall", lambda: helm("uninstall", "gpuwarden", "-n", BESIDE_NS, cluster=cluster)
        )
        print(f"\n[walkthrough] seconds per step: {json.dumps(STEPS)}", file=sys.stderr)
        kubectl(cluster, "delete", "namespace", BESIDE_NS, "--ignore-not-found", "--wait=false")
    assert gone.returncode == 0, gone.stderr
    for kind in ("clusterrole", "clusterrolebinding", "validatingadmissionpolicy", "apiservice"):
        left = kubectl(cluster, "get", kind, "-l", "app.kubernetes.io/instance=gpuwarden", "-o", "name")
        assert not left.stdout.strip(), left.stdout
