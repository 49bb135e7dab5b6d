"""deploy/ against the testbed's real kube-apiserver: kustomize builds, schema validation, Pod Security, and
RBAC that is sufficient for the components and no broader than the least-privilege table.

- every overlay is built by the real `kubectl kustomize` and equals the unit tier's renderer;
- every object of every overlay (minus the Prometheus Operator CRDs the testbed does not have) passes
  server-side dry-run with strict field validation, and the restricted Pod Security level raises no warning;
- the RBAC objects are applied for real, then SubjectAccessReviews check every permission of the table in
  tests/unit/test_deploy_manifests.py (allowed) and a list of tempting extras (denied);
- the adapter runs with its ServiceAccount's token: it reads the front-proxy CA, watches pods and nodes, and
  delegates a caller's authentication (TokenReview) and authorization (SubjectAccessReview);
- the controller's pieces run with their ServiceAccount's token: leader election, the extender's caches, the
  preemption observer's pod and event watches, the nomination loop, an Event; no request is forbidden.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter.app import Adapter
from controller.app import run_loops
from controller.extender.runtime import build_extender
from controller.nominations.loop import NominationLoop
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.kube import EventRecorder, EventType, KubeClient, LeaderElector, ObjectRef
from harness.testbed import Cluster, ensure_namespace
from tests.unit.test_deploy_manifests import ADAPTER_CLUSTER, CONTROLLER_CLUSTER, CONTROLLER_NAMESPACE
from tests.unit.test_deploy_node_agent import NODE_AGENT_CLUSTER
from tests.unit.test_deploy_render import DEPLOY, OVERLAYS, by_identity, render

NS = "gpuwarden"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
NODE_NS = "gpuwarden-node"
Obj = dict[str, Any]
Check = tuple[str, Obj]  # (user, SubjectAccessReview attributes)


def kubectl(cluster: Cluster, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """The testbed's kubectl; stdout and stderr both kept (server warnings arrive on stderr)."""
    cmd = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}", *args]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120, check=False)


def as_list(objects: list[Obj]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[list[Obj]]:
    """The namespaces and RBAC objects of base + scheduler overlay, applied for real (and removed after)."""
    ensure_namespace(cluster, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    ensure_namespace(cluster, NODE_NS, {"pod-security.kubernetes.io/enforce": "privileged"})
    ensure_namespace(cluster, "inference")
    scheduler = by_identity(render(DEPLOY / "overlays" / "scheduler"))
    node_agent = by_identity(render(DEPLOY / "overlays" / "node-agent"))
    objects = {**scheduler, **node_agent}  # the node-agent overlay is the base plus its own objects
    rbac = [o for o in objects.values() if o["kind"] in RBAC_KINDS]
    done = kubectl(cluster, "apply", "-f", "-", input=as_list(rbac))
    assert done.returncode == 0, done.stderr
    try:
        yield rbac
    finally:
        cluster_scoped = [o for o in rbac if o["kind"] in {"ClusterRole", "ClusterRoleBinding"}]
        system = [o for o in rbac if o["metadata"].get("namespace") == "kube-system"]
        kubectl(cluster, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                input=as_list(cluster_scoped + system))  # fmt: skip
        kubectl(
            cluster, "delete", "namespace", NS, NODE_NS, "inference", "--ignore-not-found", "--wait=false"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_build_equals_the_unit_renderer(cluster: Cluster, overlay: str) -> None:
    done = kubectl(cluster, "kustomize", str(DEPLOY / overlay))
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert by_identity(built) == by_identity(render(DEPLOY / overlay))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_side_dry_run_strict_and_pod_security_clean(
    cluster: Cluster, installed: list[Obj], overlay: str
) -> None:
    objects = render(DEPLOY / overlay)
    skipped = {o["kind"] for o in objects if o["kind"] in CRD_KINDS}
    assert skipped <= CRD_KINDS and (overlay != "overlays/monitoring" or skipped == CRD_KINDS)
    objects = [o for o in objects if o["kind"] not in CRD_KINDS]
    done = kubectl(
        cluster, "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=as_list(objects)
    )
    assert done.returncode == 0, done.stderr
    # e.g. "would violate PodSecurity restricted:latest", deprecated APIs; kubectl's own note about the
    # namespace the fixture created with server-side apply is the only warning allowed.
    warnings = [
        w for w in done.stderr.splitlines() if "Warning" in w and "last-applied-configuration" not in w
    ]
    assert not warnings, done.stderr
    assert done.stdout.count("(server dry run)") == len(objects), done.stdout


def sar(user: str, attrs: Obj) -> Obj:
    key = "nonResourceAttributes" if "path" in attrs else "resourceAttributes"
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}"],
                     key: attrs}}  # fmt: skip


def allowed(cluster: Cluster, checks: list[tuple[str, Obj]]) -> list[bool]:
    reviews = [sar(user, attrs) for user, attrs in checks]
    done = kubectl(cluster, "create", "-o", "json", "-f", "-", input=as_list(reviews))
    assert done.returncode == 0, done.stderr
    items, text, decoder = [], done.stdout.strip(), json.JSONDecoder()
    while text:  # kubectl prints one JSON document per created object
        item, end = decoder.raw_decode(text)
        items.append(item)
        text = text[end:].strip()
    assert len(items) == len(checks)
    return [bool(item["status"].get("allowed")) for item in items]


def attrs(group: str, resource: str, name: str, verb: str, namespace: str = "") -> Obj:
    res, _, sub = resource.partition("/")
    out = {"group": group, "resource": res, "verb": verb}
    if sub:
        out["subresource"] = sub
    if name:
        out["name"] = name
    if namespace:
        out["namespace"] = namespace
    return out


def table(user: str, rules: dict[tuple[str, str, str], str], namespace: str = "") -> list[tuple[str, Obj]]:
    return [
        (user, attrs(group, resource, name, verb, namespace or "anywhere"))
        for (group, resource, name), verbs in rules.items()
        for verb in verbs.split()
    ]


def rbac_expectations(ns: str = NS, node_ns: str = NODE_NS) -> tuple[list[Check], list[Check]]:
    """(needed, extras): the SubjectAccessReviews that must be allowed and the tempting extras that must be
    denied, for the components installed in namespace ``ns`` (node agent: ``node_ns``). The Helm chart's RBAC
    is held to the same lists (tests/e2e/test_helm_chart.py)."""
    adapter = f"system:serviceaccount:{ns}:gpuwarden-adapter"
    controller = f"system:serviceaccount:{ns}:gpuwarden-controller"
    agent = f"system:serviceaccount:{node_ns}:gpuwarden-node-agent"
    needed = (
        table(adapter, ADAPTER_CLUSTER)
        + table(controller, CONTROLLER_CLUSTER)
        + table(controller, CONTROLLER_NAMESPACE, ns)
        + table(agent, NODE_AGENT_CLUSTER)
        + [
            (adapter, attrs("authentication.k8s.io", "tokenreviews", "", "create")),
            (adapter, attrs("authorization.k8s.io", "subjectaccessreviews", "", "create")),
            (adapter, attrs("", "configmaps", "extension-apiserver-authentication", "get", "kube-system")),
        ]
    )
    extras = [
        (adapter, attrs("", "nodes", "", "patch")),
        (adapter, attrs("", "pods", "", "delete", "default")),
        (adapter, attrs("", "secrets", "", "list", "default")),
        (adapter, attrs("", "configmaps", "other", "get", "kube-system")),
        (controller, attrs("", "nodes", "", "delete")),
        (controller, attrs("", "nodes", "", "update")),
        (controller, attrs("", "pods", "", "create", "default")),
        (controller, attrs("", "pods", "", "delete", "default")),
        (controller, attrs("", "secrets", "", "get", ns)),
        (controller, attrs("", "configmaps", "gpuwarden-config", "patch", ns)),
        (controller, attrs("", "configmaps", "gpuwarden-quarantine-breaker", "get", "default")),
        (controller, attrs("coordination.k8s.io", "leases", "kube-scheduler", "update", "kube-system")),
        (controller, attrs("coordination.k8s.io", "leases", "other", "update", ns)),
        (controller, attrs("apps", "deployments", "", "patch", ns)),
        (controller, attrs("policy", "poddisruptionbudgets", "", "delete", "default")),
        (agent, attrs("", "nodes", "", "update")),
        (agent, attrs("", "nodes/status", "", "patch")),
        (agent, attrs("", "pods", "", "delete", "default")),
        (agent, attrs("", "pods/eviction", "", "create", "default")),
        (agent, attrs("", "pods/binding", "", "create", "default")),
        (agent, attrs("", "secrets", "", "get", node_ns)),
        (agent, attrs("", "configmaps", "", "list", node_ns)),
    ]
    return needed, extras


def check_rbac(cluster: Cluster, ns: str = NS, node_ns: str = NODE_NS) -> None:
    """Every needed permission allowed, every extra denied, by the real API server's authorizer."""
    needed, extras = rbac_expectations(ns, node_ns)
    granted = allowed(cluster, needed)
    assert all(granted), [c for c, ok in zip(needed, granted, strict=True) if not ok]
    granted = allowed(cluster, extras)
    assert not any(granted), [c for c, ok in zip(extras, granted, strict=True) if ok]


def test_rbac_grants_exactly_what_the_components_need(cluster: Cluster, installed: list[Obj]) -> None:
    check_rbac(cluster)


# -------------------------------------------------------------------------- components under their SA
def sa_kubeconfig(cluster: Cluster, account: str, path: Path) -> Path:
    done = kubectl(cluster, "create", "token", account, "-n", NS, "--duration=1h")
    assert done.returncode == 0, done.stderr
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "t", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_cert)}}],
        "users": [{"name": account, "user": {"token": done.stdout.strip()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "t", "user": account, "namespace": NS}}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


async def until(check: Callable[[], bool], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.5)


def outcomes(registry: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    out: dict[tuple[str, str, str], float] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == "gpuwarden_kube_requests_total":
                out[(s.labels["verb"], s.labels["resource"], s.labels["outcome"])] = s.value
    return out


def shipped_config(**overrides: Any) -> Config:
    cm = yaml.safe_load((DEPLOY / "base" / "configmap.yaml").read_text())
    data = yaml.safe_load(cm["data"]["config.yaml"])
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    return Config.model_validate(data)


async def test_adapter_runs_under_its_service_account(
    cluster: Cluster, installed: list[Obj], tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    kube = KubeClient.from_config(kubeconfig=sa_kubeconfig(cluster, "gpuwarden-adapter", tmp_path / "a.yaml"),
                                  registry=registry)  # fmt: skip
    config = shipped_config(prometheus={"url": "http://127.0.0.1:9", "retries": 0})
    adapter = Adapter(config, kube=kube, registry=registry)
    app = await adapter.start()  # reads kube-system/extension-apiserver-authentication
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        caller = kubectl(cluster, "create", "token", "default", "-n", "default").stdout.strip()
        url = f"http://127.0.0.1:{port}/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/gpu_utilization"
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await http.get(url)).status_code == 401
            # 403, not 503: the TokenReview and the SubjectAccessReview both went through.
            response = await http.get(url, headers={"Authorization": f"Bearer {caller}"})
            assert response.status_code == 403, response.text
            assert "system:serviceaccount:default:default" in response.text
        await asyncio.sleep(2)  # the pod and node watches are up
    finally:
        await runner.cleanup()
        await adapter.stop()
        await kube.aclose()
    seen = outcomes(registry)
    assert not [k for k in seen if k[2] == "forbidden"], seen
    assert {
        ("list", "pods"),
        ("list", "nodes"),
        ("create", "tokenreviews"),
        ("create", "subjectaccessreviews"),
    } <= {(v, r) for v, r, o in seen if o == "success"}, seen


async def test_controller_runs_under_its_service_account(
    cluster: Cluster, installed: list[Obj], tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    kube = KubeClient.from_config(
        kubeconfig=sa_kubeconfig(cluster, "gpuwarden-controller", tmp_path / "c.yaml"), registry=registry
    )
    config = shipped_config(nominations={"loop_interval_seconds": 1})
    elector = LeaderElector(
        kube, name="gpuwarden-controller", namespace=NS, identity="e2e-0", registry=registry
    )
    throttle = PreemptionThrottle(config, kube, registry=registry, instance="e2e-0")
    extender = build_extender(config, kube, registry=registry, preempt_hook=throttle)
    nominations = NominationLoop(config, kube, registry=registry, instance="e2e-0")
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(elector.run()),
        asyncio.create_task(extender.run()),
        asyncio.create_task(throttle.run()),
        asyncio.create_task(run_loops(elector.is_leader, stop, nominations=nominations)),
    ]
    try:
        await until(lambda: elector.is_leader.is_set() and extender.ready() and throttle.ready())
        await until(lambda: nominations.last_plan is not None)
        recorder = EventRecorder(kube, component="e2e", instance="e2e-0")
        node = cluster.get_json("nodes")["items"][0]["metadata"]["name"]
        ref = ObjectRef("v1", "Node", node)
        await recorder.emit(ref, reason="DeployRbacCheck", note="e2e", action="Check", type=EventType.NORMAL)
        await recorder.flush()
    finally:
        stop.set()
        elector.stop()
        await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await kube.aclose()
    seen = outcomes(registry)
    assert not [k for k in seen if k[2] == "forbidden"], seen
    used = {(v, r) for v, r, o in seen if o == "success"}
    assert {
        ("get", "leases"),
        ("list", "nodes"),
        ("list", "pods"),
        ("list", "events"),
        ("create", "events"),
    } <= used
    assert ("create", "leases") in used or ("update", "leases") in used, seen


# ------------------------------------------------------------------- the node agent's admission policy
def test_admission_policy_keeps_the_node_agent_to_its_own_node_and_annotations(
    cluster: Cluster, installed: list[Obj], tmp_path: Path
) -> None:
    """RBAC lets the agent patch any node or pod; the policy, keyed on the node of its pod-bound token,
    lets it change only gpuwarden.io annotations of its own Node and of pods bound to that node."""
    from tests.e2e.conftest import GPU_NODES

    mine, other = GPU_NODES
    policy = [
        o
        for o in render(DEPLOY / "overlays" / "node-agent")
        if o["kind"].startswith("ValidatingAdmissionPolicy")
        and o["metadata"]["name"] == "gpuwarden-node-agent"
    ]  # fmt: skip (the controller's: test_helm_beside)
    assert len(policy) == 2
    done = kubectl(cluster, "apply", "-f", "-", input=as_list(policy))
    assert done.returncode == 0, done.stderr

    def pod(name: str, node: str) -> Obj:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NODE_NS},
                "spec": {"serviceAccountName": "gpuwarden-node-agent", "nodeName": node,
                         "automountServiceAccountToken": False,
                         "containers": [{"name": "a", "image": "registry.invalid/agent:0"}]}}  # fmt: skip

    try:
        done = kubectl(cluster, "apply", "-f", "-", input=as_list([pod("agent", mine), pod("work", other),
                                                                   pod("work-mine", mine)]))  # fmt: skip
        assert done.returncode == 0, done.stderr
        uid = kubectl(cluster, "get", "pod", "agent", "-n", NODE_NS, "-o", "jsonpath={.metadata.uid}").stdout
        bound = ["--bound-object-kind", "Pod", "--bound-object-name", "agent", "--bound-object-uid", uid]
        token = kubectl(cluster, "create", "token", "gpuwarden-node-agent", "-n", NODE_NS, *bound)
        assert token.returncode == 0, token.stderr
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "agent",
            "clusters": [{"name": "t", "cluster": {"server": cluster.server,
                                                   "certificate-authority": str(cluster.ca_cert)}}],
            "users": [{"name": "agent", "user": {"token": token.stdout.strip()}}],
            "contexts": [{"name": "agent", "context": {"cluster": "t", "user": "agent"}}],
        }  # fmt: skip
        kubeconfig = tmp_path / "agent.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))

        def as_agent(*args: str) -> subprocess.CompletedProcess[str]:
            cmd = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={kubeconfig}", *args]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

        def annotate(kind: str, name: str, key: str, *ns: str) -> subprocess.CompletedProcess[str]:
            body = json.dumps({"metadata": {"annotations": {key: "e2e"}}})
            return as_agent("patch", kind, name, *ns, "--type=merge", "-p", body)

        # The policy takes a moment to load: wait until the other node is refused.
        deadline = time.monotonic() + 30
        while (res := annotate("node", other, "gpuwarden.io/gpu-topology")).returncode == 0:
            assert time.monotonic() < deadline, "the policy never denied a patch of another node"
            time.sleep(0.5)
        assert f'of node "{mine}" may only change its own Node' in res.stderr, res.stderr
        ok = annotate("node", mine, "gpuwarden.io/gpu-topology")
        assert ok.returncode == 0, ok.stderr
        label = as_agent("label", "node", mine, "gpuwarden.io/e2e=x")
        assert label.returncode != 0 and "may only change annotations" in label.stderr, label.stderr
        foreign = annotate("node", mine, "example.com/not-ours")
        assert foreign.returncode != 0 and "gpuwarden.io/ annotations" in foreign.stderr, foreign.stderr
        assert annotate("pod", "work-mine", "gpuwarden.io/gpu-ids", "-n", NODE_NS).returncode == 0
        denied = annotate("pod", "work", "gpuwarden.io/gpu-ids", "-n", NODE_NS)
        assert denied.returncode != 0 and "own Node and pods bound to it" in denied.stderr, denied.stderr
    finally:
        kubectl(cluster, "delete", "-f", "-", "--ignore-not-found", "--wait=false", input=as_list(policy))
        kubectl(cluster, "delete", "pods", "--all", "-n", NODE_NS, "--grace-period=0", "--force")
        for node in (mine, other):
            body = json.dumps({"metadata": {"annotations": {"gpuwarden.io/gpu-topology": None}}})
            kubectl(cluster, "patch", "node", node, "--type=merge", "-p", body)
