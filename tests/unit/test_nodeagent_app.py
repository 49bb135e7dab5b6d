"""The node agent's shell around its pure cores: topology publishing (only on change, never a guess on
error, dry-run writes nothing) and the reconcile pass against a PodResources server (a local gRPC server
answering as the kubelet does; the real kubelet is in the e2e tier)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpuwarden.config.root import Config
from gpuwarden.kube.resources import Resource
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from nodeagent.app import NodeAgent, quarantined_devices
from nodeagent.kubeletapi.podresources.v1 import api_pb2 as pr
from nodeagent.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc

NODE = "gpu-node-7"


class FakeKube:
    """Just enough of KubeClient: one Node and its pods in memory, every write recorded."""

    def __init__(self) -> None:
        meta = {"name": NODE, "uid": "n-uid", "annotations": {}}
        self.node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.created: list[dict[str, Any]] = []

    async def get(self, resource: Resource, name: str, **_: Any) -> dict[str, Any]:
        return copy.deepcopy(self.node)

    async def patch(self, resource: Resource, name: str, body: Any, *, namespace: str | None = None,
                    **_: Any) -> dict[str, Any]:  # fmt: skip
        self.patches.append((resource.plural, name, body))
        if resource.plural not in ("nodes", "pods"):
            return dict(body)  # an Event series update
        target = self.node if resource.plural == "nodes" else self.pods[(namespace or "", name)]
        for key, value in body["metadata"].get("annotations", {}).items():
            anns = target["metadata"].setdefault("annotations", {})
            if value is None:
                anns.pop(key, None)
            else:
                anns[key] = value
        return copy.deepcopy(target)

    async def create(self, resource: Resource, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.created.append(body)
        return body


def topology_file(tmp_path: Path, gpus: int = 4) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({"gpus": [
        {"index": i, "uuid": f"GPU-{i}", "pciBusId": f"0000:{0x10 + i:02x}:00.0", "numa": i // 2}
        for i in range(gpus)]}))  # fmt: skip
    return path


def agent(kube: FakeKube, topo: Path, **node_agent: Any) -> NodeAgent:
    config = Config.model_validate(
        {"node_agent": {"topology_source": "file", "topology_file": str(topo), **node_agent}}
    )
    return NodeAgent(config, kube, NODE)  # type: ignore[arg-type]


def metric(a: NodeAgent, name: str, labels: dict[str, str] | None = None) -> float:
    value = a.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


async def test_topology_is_published_once_and_only_when_it_changed(tmp_path: Path) -> None:
    kube = FakeKube()
    a = agent(kube, topology_file(tmp_path))
    await a.publish_topology()
    await a.publish_topology()
    assert len(kube.patches) == 1
    published = json.loads(kube.node["metadata"]["annotations"][TOPOLOGY_ANNOTATION])
    assert sorted(published) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]  # the device plugin's ids (uuid)
    assert a.numa_by_id == {"GPU-0": 0, "GPU-1": 0, "GPU-2": 1, "GPU-3": 1}
    assert metric(a, "gpuwarden_node_topology_publishes_total") == 1
    topology_file(tmp_path, gpus=3)  # a GPU fell off the bus: the annotation follows
    await a.publish_topology()
    assert len(kube.patches) == 2
    assert len(json.loads(kube.node["metadata"]["annotations"][TOPOLOGY_ANNOTATION])) == 3


async def test_unreadable_topology_keeps_the_previous_annotation_and_says_so(tmp_path: Path) -> None:
    kube = FakeKube()
    topo = topology_file(tmp_path)
    a = agent(kube, topo)
    await a.publish_topology()
    before = kube.node["metadata"]["annotations"][TOPOLOGY_ANNOTATION]
    topo.write_text("gpus:\n  - {index: 0, pciBusId: '0000:10:00.0', numa: 'zero'}\n")  # inconsistent
    await a.publish_topology()
    assert kube.node["metadata"]["annotations"][TOPOLOGY_ANNOTATION] == before
    assert len(kube.patches) == 1
    assert metric(a, "gpuwarden_node_topology_errors_total") == 1
    (event,) = kube.created
    assert event["reason"] == "GPUTopologyUnreadable" and event["type"] == "Warning"
    assert event["regarding"]["kind"] == "Node" and event["regarding"]["name"] == NODE


async def test_dry_run_publishes_nothing(tmp_path: Path) -> None:
    kube = FakeKube()
    a = agent(kube, topology_file(tmp_path), dry_run=True)
    await a.publish_topology()
    assert kube.patches == [] and a.topology_json is not None


class Kubelet(pr_grpc.PodResourcesListerServicer):
    def __init__(self, held: dict[tuple[str, str], list[str]]) -> None:
        self.held = held

    async def List(self, request: Any, context: Any) -> Any:
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(namespace=ns, name=name, containers=[pr.ContainerResources(name="c", devices=[
                pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[g]) for g in ids])])
            for (ns, name), ids in self.held.items()])  # fmt: skip

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return pr.AllocatableResourcesResponse(
            devices=[pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-0", "GPU-1"])]
        )


@pytest.mark.parametrize("dry_run", [False, True], ids=["act", "dry-run"])
async def test_reconcile_pass_writes_the_actual_set_and_counts(tmp_path: Path, dry_run: bool) -> None:
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(Kubelet({("ns", "p"): ["GPU-3", "GPU-2"]}), server)  # type: ignore[no-untyped-call]
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    kube = FakeKube()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": "p", "uid": "u",
           "annotations": {"gpuwarden.io/gpu-ids": "GPU-0,GPU-1"}}}  # fmt: skip
    kube.pods[("ns", "p")] = pod
    a = agent(kube, topology_file(tmp_path), pod_resources_socket=str(sock), dry_run=dry_run)
    a.pods.store["ns/p"] = pod
    a.pods.synced.set()
    try:
        await a.publish_topology()
        (assignment,) = await a.reconcile_once()
    finally:
        await a.reader.aclose()
        await server.stop(0)
    assert assignment.outcome.value == "overridden"
    assert a.ready()
    pod_patches = [p for p in kube.patches if p[0] == "pods"]
    if dry_run:
        assert pod_patches == [] and kube.created == []
        assert metric(a, "gpuwarden_node_assignments_total", {"outcome": "overridden"}) == 0
        return
    anns = kube.pods[("ns", "p")]["metadata"]["annotations"]
    assert anns["gpuwarden.io/gpu-ids"] == "GPU-2,GPU-3"
    assert anns["gpuwarden.io/gpu-ids-requested"] == "GPU-0,GPU-1"
    assert anns["gpuwarden.io/numa-node"] == "1"
    assert metric(a, "gpuwarden_node_assignments_total", {"outcome": "overridden"}) == 1
    assert metric(a, "gpuwarden_node_allocatable_devices") == 2
    assert [e["reason"] for e in kube.created] == ["GPUAssignmentOverridden"]


async def test_kubelet_down_is_unknown_not_ready(tmp_path: Path) -> None:
    kube = FakeKube()
    a = agent(kube, topology_file(tmp_path), pod_resources_socket=str(tmp_path / "absent.sock"))
    a.pods.synced.set()
    try:
        assert await a.reconcile_once() == []
    finally:
        await a.reader.aclose()
    assert not a.ready() and kube.patches == []
    assert metric(a, "gpuwarden_node_podresources_reads_total", {"outcome": "error"}) == 1


def _record(state: str, *gpus: str) -> str:
    evidence = [{"reason": "xid-79", "gpu": g} if g else {"reason": "gpu-missing"} for g in gpus]
    return json.dumps({"version": 1, "state": state, "reason": "xid-79", "evidence": evidence})


TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
UUIDS = {"0": "GPU-0", "1": "GPU-1", "2": "GPU-2", "3": "GPU-3"}


@pytest.mark.parametrize(
    ("tainted", "annotation", "expect"),
    [
        (True, None, {"0", "1", "2", "3"}),
        (True, "not json", {"0", "1", "2", "3"}),
        (True, _record("quarantined", "GPU-1", "GPU-3"), {"1", "3"}),
        (True, _record("quarantined", ""), {"0", "1", "2", "3"}),
        (True, _record("quarantined", "GPU-9"), {"0", "1", "2", "3"}),
        (False, _record("quarantined", "GPU-1"), set()),
        (False, None, set()),
        (True, _record("released", "GPU-1"), {"0", "1", "2", "3"}),
    ],
    ids=[
        "taint-no-record",
        "taint-garbage-record",
        "two-gpus",
        "node-level",
        "unmapped-uuid",
        "record-without-taint",
        "healthy",
        "taint-released-record",
    ],
)
def test_quarantined_devices(tainted: bool, annotation: str | None, expect: set[str]) -> None:
    node = {
        "metadata": {"annotations": {} if annotation is None else {"gpuwarden.io/quarantine": annotation}},
        "spec": {"taints": [TAINT] if tainted else []},
    }
    assert quarantined_devices(node, list(UUIDS), UUIDS) == expect


async def test_a_write_the_watch_has_not_delivered_yet_is_not_repeated(tmp_path: Path) -> None:
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(Kubelet({("ns", "p"): ["GPU-3"]}), server)  # type: ignore[no-untyped-call]
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    kube = FakeKube()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": "p", "uid": "u1",
           "annotations": {"gpuwarden.io/gpu-ids": "GPU-0"}}}  # fmt: skip
    kube.pods[("ns", "p")] = copy.deepcopy(pod)
    a = agent(kube, topology_file(tmp_path), pod_resources_socket=str(sock))
    a.pods.store["ns/p"] = pod  # the watch cache keeps the old annotations (our patch not delivered yet)
    try:
        assert len(await a.reconcile_once()) == 1
        assert await a.reconcile_once() == []  # not patched, counted or evented twice
        # A new pod of the same name (another uid) is reconciled afresh.
        a.pods.store["ns/p"] = {**pod, "metadata": {**pod["metadata"], "uid": "u2"}}
        assert len(await a.reconcile_once()) == 1
    finally:
        await a.reader.aclose()
        await server.stop(0)
    assert metric(a, "gpuwarden_node_assignments_total", {"outcome": "overridden"}) == 2
    assert len([p for p in kube.patches if p[0] == "pods"]) == 2


async def test_enforce_mode_withholds_the_device_plugin_while_a_dra_driver_owns_the_gpus(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "kubelet" / "plugins_registry"
    registry.mkdir(parents=True)
    socket_file = registry / "gpu.nvidia.com-reg.sock"
    socket_file.touch()
    (registry / "other.example.com-reg.sock").touch()  # a DRA driver of something else: not a GPU owner
    kube = FakeKube()
    a = agent(
        kube,
        topology_file(tmp_path),
        kubelet_root_dir=str(tmp_path / "kubelet"),
        device_plugin_dir=str(tmp_path / "dp"),
        device_plugin={"enabled": True},
    )
    assert a.plugin is not None
    serving: list[str] = []

    async def fake_serve(poll_interval: float = 1.0) -> None:
        serving.append("start")
        try:
            await asyncio.Event().wait()
        finally:
            serving.append("stop")

    a.plugin.run = fake_serve  # type: ignore[method-assign]
    a.pods.synced.set()
    a.nodes.synced.set()
    a._topology_known.set()
    task = asyncio.create_task(a._run_plugin(recheck_seconds=0.01))

    async def until(condition: Any) -> None:
        for _ in range(500):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")

    def withheld_events() -> list[dict[str, Any]]:
        return [e for e in kube.created if e.get("reason") == "GPUDevicePluginWithheld"]

    try:
        await until(lambda: metric(a, "gpuwarden_node_device_plugin_withheld") == 1)
        await asyncio.sleep(0.1)  # several rechecks: still withheld, said once
        assert serving == [] and len(withheld_events()) == 1
        assert "DRA driver gpu.nvidia.com is registered" in withheld_events()[0]["note"]
        socket_file.unlink()  # the driver is gone: serve
        await until(lambda: serving == ["start"])
        assert metric(a, "gpuwarden_node_device_plugin_withheld") == 0
        (registry / "gpu.nvidia.com-0b1c2d-reg.sock").touch()  # registers again (rolling-update name)
        await until(lambda: serving == ["start", "stop"])
        await until(lambda: metric(a, "gpuwarden_node_device_plugin_withheld") == 1)
        assert a._withheld == "gpu.nvidia.com"  # a new episode (its Event joins the first one's series)
    finally:
        a._stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


SHARED_LABELS = {
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
}


async def test_enforce_mode_withholds_the_device_plugin_on_a_node_that_shares_its_gpus(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    a = agent(
        kube,
        topology_file(tmp_path),
        kubelet_root_dir=str(tmp_path / "kubelet"),
        device_plugin_dir=str(tmp_path / "dp"),
        device_plugin={"enabled": True},
    )
    assert a.plugin is not None
    serving: list[str] = []

    async def fake_serve(poll_interval: float = 1.0) -> None:
        serving.append("start")
        try:
            await asyncio.Event().wait()
        finally:
            serving.append("stop")

    def node_obj(labels: dict[str, str], gpus: str) -> dict[str, Any]:
        return {
            "metadata": {"name": a.node, "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": gpus}},
        }

    a.plugin.run = fake_serve  # type: ignore[method-assign]
    a.nodes.store[a.node] = node_obj(SHARED_LABELS, "32")
    a.pods.synced.set()
    a.nodes.synced.set()
    a._topology_known.set()
    task = asyncio.create_task(a._run_plugin(recheck_seconds=0.01))

    async def until(condition: Any) -> None:
        for _ in range(500):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")

    def withheld_events() -> list[dict[str, Any]]:
        return [e for e in kube.created if e.get("reason") == "GPUDevicePluginWithheld"]

    try:
        await until(lambda: metric(a, "gpuwarden_node_device_plugin_withheld") == 1)
        await asyncio.sleep(0.1)  # several rechecks: still withheld, said once
        assert serving == [] and len(withheld_events()) == 1
        note = withheld_events()[0]["note"]
        assert "shares its GPUs (time-slicing: 8 physical GPUs, 4 replicas each" in note
        a.nodes.store[a.node] = node_obj({"nvidia.com/gpu.count": "8"}, "8")  # sharing turned off: serve
        await until(lambda: serving == ["start"])
        assert metric(a, "gpuwarden_node_device_plugin_withheld") == 0
        a.nodes.store[a.node] = node_obj(SHARED_LABELS, "32")  # and on again: stop serving
        await until(lambda: serving == ["start", "stop"])
        assert a._withheld == "shared:time-slicing"
    finally:
        a._stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_an_unreadable_plugin_registry_is_no_owner(tmp_path: Path) -> None:
    a = agent(FakeKube(), topology_file(tmp_path), kubelet_root_dir=str(tmp_path / "missing"))
    assert a.dra_owner() == ""
