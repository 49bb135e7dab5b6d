"""Proofs on a real kubelet node (kubelet v1.37.2, v1.35.4 in `make test-oldest`; containerd 1.6, runc, CNI
bridge) beside a kwok node.

The contracts that end on a node — a device plugin's Allocate reaching the container, the PodResources API,
an Eviction ending in SIGTERM within the grace period, a PodDisruptionBudget holding, ``kubectl logs`` — are
checked here against the real kubelet, reading the facts from the container's own output. These are the
tests the node-agent and drain work builds on. The cluster is conftest's `node_cluster` (its own: only one
real node can run per machine, and the session cluster's kwok manages every node).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from harness.testbed import (
    Cluster,
    poll,
)
from harness.testbed.images import TOOL_IMAGE
from harness.testbed.realnode import (
    KUBELET_SOCKET,
    REAL_NODE_LABEL,
    REAL_NODE_TAINT,
    RealNode,
    RealNodeSpec,
)
from nodeagent.kubeletapi.podresources.v1 import api_pb2 as pr
from nodeagent.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.e2e.conftest import KWOK_NODE, REAL_NODE
from tests.e2e.minimal_device_plugin import MinimalDevicePlugin

GPU = "nvidia.com/gpu"
LINE = re.compile(r"^gwtool: t=(?P<t>[0-9.]+) (?P<text>.*)$")


@pytest.fixture
def ns(node_ns: str) -> str:
    return node_ns


@pytest.fixture
def core(node_core: k8s.CoreV1Api) -> k8s.CoreV1Api:
    return node_core


def tool_pod(
    name: str,
    args: list[str],
    *,
    gpus: int = 0,
    grace: int | None = None,
    record_dir: Path | None = None,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A gwtool pod that only the real node accepts (its label and taint), placed by kube-scheduler."""
    container: dict[str, Any] = {
        "name": "main",
        "image": TOOL_IMAGE.name,
        "imagePullPolicy": "Never",
        "args": args,
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        "resources": {"limits": {"cpu": "100m", "memory": "32Mi", **({GPU: str(gpus)} if gpus else {})}},
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if record_dir is not None:
        spec["volumes"] = [
            {"name": "record", "hostPath": {"path": str(record_dir), "type": "DirectoryOrCreate"}}
        ]
        container["volumeMounts"] = [{"name": "record", "mountPath": "/record"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": spec,
    }


def create(cluster: Cluster, ns: str, *objects: dict[str, Any]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(doc))


def pod_phase(cluster: Cluster, ns: str, name: str) -> str:
    return cluster.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase}", check=False)


def wait_phase(cluster: Cluster, ns: str, name: str, *phases: str, timeout: float = 90) -> str:
    return poll(
        lambda: (ph := pod_phase(cluster, ns, name)) in phases and ph,
        timeout=timeout,
        what=f"pod {ns}/{name} in phase {'/'.join(phases)}",
    )


def events(text: str) -> list[tuple[float, str]]:
    """gwtool's lines as (unix time, text)."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m:
            out.append((float(m["t"]), m["text"]))
    return out


def first(evts: list[tuple[float, str]], prefix: str) -> tuple[float, str] | None:
    return next((e for e in evts if e[1].startswith(prefix)), None)


# --------------------------------------------------------------------------------------------- registration
def test_real_node_is_run_by_its_kubelet_and_kwok_keeps_off_it(node_cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in node_cluster.get_json("nodes")["items"]}
    assert set(nodes) == {REAL_NODE, KWOK_NODE}
    real = nodes[REAL_NODE]
    info = real["status"]["nodeInfo"]
    assert info["kubeletVersion"] == node_cluster.binaries.kube_version
    assert info["containerRuntimeVersion"].startswith("containerd://1.6."), info
    assert real["metadata"]["labels"][REAL_NODE_LABEL] == "true"
    assert REAL_NODE_TAINT in real["spec"].get("taints", [])
    assert "kwok.x-k8s.io/node" not in real["metadata"].get("annotations", {})
    # The kubelet's own identity renews the node's Lease (kwok would renew it as the admin user).
    lease = poll(
        lambda: node_cluster.kubectl(
            "get", "lease", REAL_NODE, "-n", "kube-node-lease", "-o", "json", check=False
        ),
        timeout=30,
        what=f"Lease kube-node-lease/{REAL_NODE}",
    )
    assert json.loads(lease)["spec"]["holderIdentity"] == REAL_NODE
    # Its credentials are a real node's, and NodeRestriction refuses it changes to another Node.
    kubeconfig = node_cluster.real_node().run_dir / "kubelet.kubeconfig"
    as_node = [f"--kubeconfig={kubeconfig}"]
    whoami = json.loads(node_cluster.kubectl(*as_node, "auth", "whoami", "-o", "json"))
    assert whoami["status"]["userInfo"]["username"] == f"system:node:{REAL_NODE}"
    assert "system:nodes" in whoami["status"]["userInfo"]["groups"]
    patch = json.dumps({"metadata": {"labels": {"gpuwarden.io/probe": "x"}}})
    with pytest.raises(Exception, match=r"(?i)forbidden"):
        node_cluster.kubectl(*as_node, "patch", "node", KWOK_NODE, "--type=merge", "-p", patch)


# --------------------------------------------------------------------------------------------- (a) a pod runs
def test_scheduled_pod_runs_to_completion_and_kubectl_logs_shows_its_output(
    node_cluster: Cluster, ns: str
) -> None:
    token = uuid.uuid4().hex
    create(
        node_cluster,
        ns,
        tool_pod("hello", ["--env", "GWTEST_", "--sleep", "0.5"], env={"GWTEST_TOKEN": token}),
    )
    wait_phase(node_cluster, ns, "hello", "Succeeded", "Failed")
    pod = node_cluster.get_json("pod", "hello", "-n", ns)
    assert pod["spec"]["nodeName"] == REAL_NODE  # placed by kube-scheduler, not by the test
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    logs = node_cluster.kubectl("logs", "hello", "-n", ns)
    texts = [t for _, t in events(logs)]
    assert f"env GWTEST_TOKEN={token}" in texts
    assert texts[-1] == "event=exit reason=done code=0"


# ------------------------------------------------------------------ (b, c) device plugin + PodResources
def test_device_plugin_allocation_reaches_the_container_and_podresources(
    node_cluster: Cluster, real_node: RealNode, ns: str
) -> None:
    devices = [f"GPU-gwtest-{i}" for i in range(4)]
    plugin = MinimalDevicePlugin(resource=GPU, devices=devices, plugin_dir=real_node.device_plugin_dir)
    plugin.start(KUBELET_SOCKET)
    try:
        poll(
            lambda: node_cluster.get_json("node", REAL_NODE)["status"].get("allocatable", {}).get(GPU) == "4",
            timeout=60,
            what=f"{GPU}=4 allocatable on {REAL_NODE}",
        )
        create(
            node_cluster,
            ns,
            tool_pod("gpu2", ["--env", "NVIDIA_VISIBLE_DEVICES", "--env", "GWTEST_", "--sleep", "0"], gpus=2),
        )
        wait_phase(node_cluster, ns, "gpu2", "Running")
        logs = poll(
            lambda: (
                (out := node_cluster.kubectl("logs", "gpu2", "-n", ns, check=False))
                and "event=sleeping" in out
                and out
            ),
            timeout=30,
            what="gpu2's output",
        )
        # Exactly one Allocate, for 2 of the plugin's devices; the container saw exactly that answer.
        assert len(plugin.allocations) == 1, plugin.allocations
        allocated = plugin.allocations[0]
        assert len(allocated) == 2 and set(allocated) <= set(devices)
        texts = [t for _, t in events(logs)]
        assert f"env NVIDIA_VISIBLE_DEVICES={','.join(allocated)}" in texts
        assert f"env GWTEST_DEVICES={','.join(allocated)}" in texts

        with grpc.insecure_channel(f"unix://{real_node.pod_resources_socket}") as channel:
            lister = pr_grpc.PodResourcesListerStub(channel)
            listed = lister.List(pr.ListPodResourcesRequest(), timeout=10)
            mine = [p for p in listed.pod_resources if p.namespace == ns and p.name == "gpu2"]
            assert len(mine) == 1, [f"{p.namespace}/{p.name}" for p in listed.pod_resources]
            ids = [
                i
                for c in mine[0].containers
                if c.name == "main"
                for d in c.devices
                if d.resource_name == GPU
                for i in d.device_ids
            ]
            assert sorted(ids) == sorted(allocated)
            got = lister.Get(pr.GetPodResourcesRequest(pod_name="gpu2", pod_namespace=ns), timeout=10)
            assert sorted(
                i for c in got.pod_resources.containers for d in c.devices for i in d.device_ids
            ) == sorted(allocated)
            alloc = lister.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=10)
            assert sorted(i for d in alloc.devices if d.resource_name == GPU for i in d.device_ids) == sorted(
                devices
            )
        node_cluster.kubectl("delete", "pod", "gpu2", "-n", ns, "--grace-period=0", "--force", check=False)
    finally:
        plugin.stop()


# --------------------------------------------------------------------------------------------- (d) eviction
def _evict(core: k8s.CoreV1Api, ns: str, name: str) -> None:
    body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=ns))
    core.create_namespaced_pod_eviction(name=name, namespace=ns, body=body)


def _gone(core: k8s.CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_eviction_sends_sigterm_and_honours_the_grace_period(
    node_cluster: Cluster, core: k8s.CoreV1Api, ns: str, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    # "clean": grace 30 s, the container needs 2 s after SIGTERM and gets them.
    # "killed": grace 2 s, the container would need 120 s; the kubelet kills it when the grace period ends.
    pods = {"clean": (30, 2), "killed": (2, 120)}
    create(
        node_cluster,
        ns,
        *(
            tool_pod(
                name,
                ["--record", f"/record/{name}.log", "--sleep", "0", "--term-delay", str(delay)],
                grace=grace,
                record_dir=records,
            )
            for name, (grace, delay) in pods.items()
        ),
    )
    for name in pods:
        wait_phase(node_cluster, ns, name, "Running")
        poll(
            lambda n=name: (
                (records / f"{n}.log").is_file() and "event=sleeping" in (records / f"{n}.log").read_text()
            ),
            timeout=30,
            what=f"{name} running its workload",
        )
    t_evict = time.time()
    for name in pods:
        _evict(core, ns, name)
    gone_at: dict[str, float] = {}

    def all_gone() -> bool:
        for name in pods:
            if name not in gone_at and _gone(core, ns, name):
                gone_at[name] = time.time()
        return len(gone_at) == len(pods)

    poll(all_gone, timeout=90, interval=0.1, what="evicted pods gone")
    clean = events((records / "clean.log").read_text())
    killed = events((records / "killed.log").read_text())
    # Both containers got SIGTERM after the eviction was accepted.
    sig_clean, sig_killed = first(clean, "event=sigterm"), first(killed, "event=sigterm")
    assert sig_clean and sig_killed, (clean, killed)
    assert sig_clean[0] >= t_evict - 1 and sig_killed[0] >= t_evict - 1
    # Clean: it finished its 2 s of shutdown work and exited by itself (no SIGKILL inside the grace period).
    exit_clean = first(clean, "event=exit reason=sigterm")
    assert exit_clean is not None, clean
    assert exit_clean[0] - sig_clean[0] >= 2.0
    # Killed: no exit of its own; it was not killed before its 2 s grace period ended.
    assert first(killed, "event=exit") is None, killed
    assert gone_at["killed"] - sig_killed[0] >= 2.0 - 0.2


def test_eviction_forbidden_by_a_pdb_gets_429_and_the_pod_keeps_running(
    node_cluster: Cluster, core: k8s.CoreV1Api, ns: str, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    labels = {"app": "guarded"}
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    pod = tool_pod(
        "guarded",
        ["--record", "/record/guarded.log", "--sleep", "0"],
        labels=labels,
        record_dir=records,
        grace=5,
    )
    create(node_cluster, ns, pdb, pod)
    wait_phase(node_cluster, ns, "guarded", "Running")
    poll(
        lambda: (
            (s := node_cluster.get_json("pdb", "guarded", "-n", ns).get("status", {})).get("currentHealthy")
            == 1
            and s.get("disruptionsAllowed") == 0
        ),
        timeout=60,
        what="PDB guarded computed (1 healthy, 0 disruptions allowed)",
    )
    with pytest.raises(ApiException) as err:
        _evict(core, ns, "guarded")
    assert err.value.status == 429, err.value
    assert "disruption budget" in (err.value.body or "").lower()
    time.sleep(3)  # long enough for a wrongly accepted eviction to have reached the kubelet (sub-second here)
    assert pod_phase(node_cluster, ns, "guarded") == "Running"
    assert first(events((records / "guarded.log").read_text()), "event=sigterm") is None
    node_cluster.kubectl("delete", "pdb", "guarded", "-n", ns)
    node_cluster.kubectl("delete", "pod", "guarded", "-n", ns, "--grace-period=0", "--force", check=False)


def test_a_second_real_node_on_this_machine_is_refused(node_cluster: Cluster, tmp_path: Path) -> None:
    from harness.testbed.pki import load_keypair
    from harness.testbed.realnode import RealNodeError

    first_node = node_cluster.real_node()
    second = RealNode(
        RealNodeSpec(name="real-node-1", bridge="gwtb1", subnet="10.244.251.0/24"),
        kubelet_binary=node_cluster.binaries.path("kubelet"),
        ctl_binary=node_cluster.binaries.path("kubectl"),
        server=node_cluster.server,
        cluster_ca=load_keypair(node_cluster.ca_cert, node_cluster.cluster_dir / "pki" / "ca.key"),
        kubelet_client_ca=tmp_path / "unused-ca.crt",
        cache_dir=tmp_path / "images",
    )
    with pytest.raises(RealNodeError, match="only one can run at a time"):
        second.start()
    assert not second.run_dir.exists()  # cleaned up, and the first node untouched:
    assert first_node.pids().keys() >= {"kubelet", "containerd"}
    conds = {c["type"]: c["status"] for c in node_cluster.get_json("node", REAL_NODE)["status"]["conditions"]}
    assert conds["Ready"] == "True"
