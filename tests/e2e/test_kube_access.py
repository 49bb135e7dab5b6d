"""gpuwarden.kube against the real control plane: list+watch, 410 relist, patches, Events, Lease election.

Everything here talks to the test bed's kube-apiserver through `KubeClient` with the admin kubeconfig. To get
a genuine 410 Gone we do what the API server itself does every five minutes — compact etcd's history — and
then watch from resourceVersion "1", which no longer exists.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.gpus.devices import claim_names
from controller.gpus.objects import pod_info
from controller.gpus.podproto import pod_object
from gpuwarden.errors import KubeConflict, KubeGone, KubeNotFound
from gpuwarden.kube import (
    ADDED,
    CONFIG_MAPS,
    DELETED,
    EVENTS,
    LEASES,
    MODIFIED,
    NODES,
    PODS,
    EventRecorder,
    EventType,
    Informer,
    JsonObject,
    KubeClient,
    LeaderElector,
    LeaseDurations,
    MetadataSource,
    PatchType,
    ProtobufSource,
    WatchEvent,
    json_pointer,
    patch_status,
    patch_with_retry,
    with_precondition,
)
from gpuwarden.kube.resources import Resource
from gpuwarden.kube.stream import WatchStream
from gpuwarden.wellknown import GPU_CLAIMED_AT, GPU_IDS, GPU_NODE
from harness.testbed import Cluster
from tests.e2e.conftest import GPU_NODES
from tests.unit.podproto_support import decoded_part

pytestmark = pytest.mark.e2e


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def kube(cluster: Cluster, registry: CollectorRegistry) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(kubeconfig=cluster.kubeconfig, registry=registry)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def node(kube: KubeClient) -> AsyncIterator[str]:
    """A throw-away Node (kwok marks it Ready a moment later), deleted afterwards."""
    name = f"kube-e2e-{uuid.uuid4().hex[:6]}"
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"e2e": "kube"}}}
    await kube.create(NODES, body)
    try:
        yield name
    finally:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NODES, name)


async def eventually(check: Callable[[], bool | Awaitable[bool]], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.05)


def requests(registry: CollectorRegistry, verb: str, resource: str, outcome: str) -> float:
    labels = {"verb": verb, "resource": resource, "outcome": outcome}
    return registry.get_sample_value("gpuwarden_kube_requests_total", labels) or 0.0


def _etcd_post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


@pytest.fixture
async def compacted(cluster: Cluster) -> int:
    """Compact etcd at its current revision (through etcd's own JSON gateway), as the apiserver does."""
    args = cluster.component("etcd").get("args") or []
    client_url = next(str(a).split("=", 1)[1] for a in args if str(a).startswith("--listen-client-urls="))
    # A write of our own first: the revision moves, so a second compaction (the next test) is never one at
    # an already compacted revision, which etcd refuses.
    key, value = base64.b64encode(b"/gpuwarden-e2e/compaction").decode(), base64.b64encode(b"x").decode()
    head = await asyncio.to_thread(_etcd_post, f"{client_url}/v3/kv/put", {"key": key, "value": value})
    revision = int(head["header"]["revision"])
    await asyncio.to_thread(
        _etcd_post, f"{client_url}/v3/kv/compaction", {"revision": revision, "physical": True}
    )
    return revision


# ------------------------------------------------------------------------------------------ list + watch
async def test_informer_lists_and_watches_nodes(kube: KubeClient) -> None:
    informer = Informer(kube, NODES)
    seen: list[WatchEvent] = []
    task = asyncio.create_task(informer.run(seen.append))
    name = f"kube-e2e-{uuid.uuid4().hex[:6]}"
    try:
        await asyncio.wait_for(informer.synced.wait(), 20)
        assert set(GPU_NODES) <= set(informer.store)  # the fixture's kwok GPU nodes came with the list
        await kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        await eventually(lambda: any(e.type == ADDED and e.object["metadata"]["name"] == name for e in seen))
        await kube.patch(NODES, name, {"metadata": {"labels": {"watched": "yes"}}})
        await eventually(
            lambda: (informer.get(name) or {}).get("metadata", {}).get("labels", {}).get("watched") == "yes"
        )
        assert any(e.type == MODIFIED and e.object["metadata"]["name"] == name for e in seen)
        await kube.delete(NODES, name)
        await eventually(
            lambda: any(e.type == DELETED and e.object["metadata"]["name"] == name for e in seen)
        )
        assert informer.get(name) is None
        assert informer.lists == 1  # no relist was needed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NODES, name)


async def test_metadata_informer_sees_partial_objects_through_its_transform(kube: KubeClient) -> None:
    """The real API server honours the PartialObjectMetadata Accept headers for list and watch."""
    kinds: list[str] = []

    def keep(obj: JsonObject) -> JsonObject:
        kinds.append(str(obj.get("kind")))
        assert "spec" not in obj and "status" not in obj  # metadata only on the wire
        meta = obj["metadata"]
        return {"metadata": {k: meta[k] for k in ("name", "labels", "resourceVersion") if k in meta}}

    informer = Informer(MetadataSource(kube, transform=keep), NODES, page_size=2)
    seen: list[WatchEvent] = []
    task = asyncio.create_task(informer.run(seen.append))
    name = f"kube-e2e-{uuid.uuid4().hex[:6]}"
    try:
        await asyncio.wait_for(informer.synced.wait(), 20)
        assert set(GPU_NODES) <= set(informer.store)  # listed over several pages of 2
        assert set(kinds) == {"PartialObjectMetadata"}
        await kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        await kube.patch(NODES, name, {"metadata": {"labels": {"watched": "yes"}}})
        await eventually(
            lambda: (informer.get(name) or {}).get("metadata", {}).get("labels") == {"watched": "yes"}
        )
        assert set((informer.get(name) or {})["metadata"]) == {"name", "labels", "resourceVersion"}
        await kube.delete(NODES, name)
        await eventually(
            lambda: any(e.type == DELETED and e.object["metadata"]["name"] == name for e in seen)
        )
        assert set(kinds) == {"PartialObjectMetadata"}  # watch events too
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NODES, name)


@pytest.mark.parametrize("protobuf", [False, True], ids=["json", "protobuf"])
async def test_watch_from_compacted_resource_version_is_gone(
    kube: KubeClient, compacted: int, protobuf: bool
) -> None:
    # Events have no watch cache in kube-apiserver, so this watch reaches etcd, whose history before
    # `compacted` is gone. (Node watches are served from the watch cache, which on a young cluster still
    # reaches back to resourceVersion 1 whatever etcd compacted.) As protobuf, the ERROR event's Status
    # (or the answer's) is a protobuf one and must read the same.
    decode = (lambda raw: {}) if protobuf else None
    stream = kube.watch(EVENTS, namespace="default", resource_version="1", timeout_seconds=5, protobuf=decode)
    try:
        first = await anext(stream)
    except KubeGone:
        return  # HTTP 410 on the watch request itself
    finally:
        await stream.aclose()
    # Or, as kube-apiserver does it: a 200 stream whose first event is an ERROR carrying a 410 Status.
    assert first["type"] == "ERROR", first
    assert (first["object"]["code"], first["object"]["reason"]) == (410, "Expired"), first


class StaleFirstWatch:
    """The real client, except the informer's first watch starts from the compacted resourceVersion 1."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.watch_versions: list[str] = []

    async def list_objects(self, resource: Resource, **kwargs: Any) -> Any:
        return await self.client.list_objects(resource, **kwargs)

    def watch(self, resource: Resource, *, resource_version: str, **kwargs: Any) -> WatchStream:
        rv = "1" if not self.watch_versions else resource_version
        self.watch_versions.append(rv)
        return self.client.watch(resource, resource_version=rv, **kwargs)


async def test_informer_relists_after_a_real_410(kube: KubeClient, namespace: str, compacted: int) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "subject", "namespace": namespace},
    }
    subject = await kube.create(CONFIG_MAPS, config_map, namespace=namespace)
    recorder = EventRecorder(kube, component="e2e", instance="e2e-0")
    before = await recorder.emit(subject, reason="BeforeRelist", note="listed", action="Probe")
    assert before is not None
    source = StaleFirstWatch(kube)
    informer = Informer(source, EVENTS, namespace=namespace)
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: informer.lists >= 2 and len(source.watch_versions) >= 2)
        assert source.watch_versions[0] == "1"
        assert source.watch_versions[1] not in ("1", "")  # re-watched from the relist's resourceVersion
        assert f"{namespace}/{before['metadata']['name']}" in informer.store
        after = await recorder.emit(subject, reason="AfterRelist", note="watched", action="Probe")
        assert after is not None
        await eventually(lambda: f"{namespace}/{after['metadata']['name']}" in informer.store)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


GPU_RESOURCE = "nvidia.com/gpu"


def gpu_pod(name: str, namespace: str, **meta: Any) -> JsonObject:
    """A pod no scheduler picks up (its status stays ours to write) asking for GPUs in several ways: an app
    container, a restartable sidecar and a larger init step (5 GPUs at its peak)."""

    def container(name: str, limits: dict[str, str], **extra: Any) -> JsonObject:
        return {"name": name, "image": "busybox", "resources": {"limits": limits}, **extra}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": name},
            "annotations": {GPU_IDS: "0,1", GPU_NODE: "gpu-0", GPU_CLAIMED_AT: "1700000000.5"},
            **meta,
        },
        "spec": {
            "schedulerName": "nobody",
            "containers": [
                container("main", {GPU_RESOURCE: "2", "cpu": "1"}, env=[{"name": "HOME", "value": "/root"}]),
                container("logger", {"cpu": "100m"}),
            ],
            "initContainers": [
                container("sidecar", {GPU_RESOURCE: "1"}, restartPolicy="Always"),
                container("warmup", {GPU_RESOURCE: "4"}),
            ],
        },
    }


def rich_pod(name: str, namespace: str, owner: JsonObject, other: JsonObject) -> JsonObject:
    """`gpu_pod` with every other field the controller's pod readers read: a controller owner reference and
    one more (to live objects, so the garbage collector leaves the pod alone), labels with a
    pod-template-hash, tolerations (the API server adds its default ones with tolerationSeconds), a
    nodeSelector and DRA claims (a claim by name and one from a template)."""
    obj = gpu_pod(name, namespace)
    obj["metadata"]["labels"] |= {"pod-template-hash": "7d9c5b8f4", "gpuwarden.io/idle-exclude": "true"}
    refs = [
        {"apiVersion": "v1", "kind": o["kind"], **{k: o["metadata"][k] for k in ("name", "uid")}}
        for o in (owner, other)
    ]
    obj["metadata"]["ownerReferences"] = [
        refs[0] | {"controller": True, "blockOwnerDeletion": False},
        refs[1],
    ]
    obj["spec"] |= {
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
            {"key": "gpuwarden.io/gpu-unhealthy", "operator": "Exists", "effect": "NoExecute"}
            | {"tolerationSeconds": 60},
            {"operator": "Exists", "effect": "NoSchedule"},
        ],
        "nodeSelector": {"gpu": "h100", "kubernetes.io/arch": "amd64"},
        "resourceClaims": [
            {"name": "gpus", "resourceClaimName": f"{name}-gpus"},
            {"name": "scratch", "resourceClaimTemplateName": "scratch-template"},
        ],
    }
    return obj


async def test_protobuf_pod_informer_reads_every_pod_as_json_does(kube: KubeClient, namespace: str) -> None:
    """The controller's shared pod informer (protobuf, decoded to the fields its readers read) against the
    real API server's encoding: every pod, listed or watched, equals its JSON on every path podproto
    decodes (owner references, labels, tolerations, nodeSelector, DRA claims, condition messages and
    times, start time ...), and gives the `PodInfo` its JSON gives."""
    owners = [
        await kube.create(
            CONFIG_MAPS,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}},
            namespace=namespace,
        )
        for n in ("owner", "other")
    ]
    await kube.create(PODS, gpu_pod("listed", namespace), namespace=namespace)
    await kube.create(PODS, rich_pod("listed-rich", namespace, *owners), namespace=namespace)
    await kube.create(PODS, gpu_pod("going", namespace, finalizers=["gpuwarden.io/e2e"]), namespace=namespace)
    await kube.delete(PODS, "going", namespace=namespace)  # held by the finalizer: a deletionTimestamp
    informer = Informer(ProtobufSource(kube, decode=pod_object), PODS, namespace=namespace)
    task = asyncio.create_task(informer.run())
    server: dict[str, JsonObject] = {}

    async def differences() -> dict[str, Any]:
        """Per pod, (its JSON's decoded part, the informer's) where they or their `PodInfo`s differ."""
        listed = (await kube.list_objects(PODS, namespace=namespace)).items
        server.clear()
        server.update({f"{namespace}/{p['metadata']['name']}": p for p in listed})
        # the envelope's apiVersion and kind aside (the informer has them from either encoding)
        stored = {
            k: {f: v for f, v in o.items() if f not in ("apiVersion", "kind")}
            for k, o in informer.store.items()
        }
        out: dict[str, Any] = {
            key: (decoded_part(p), stored.get(key))
            for key, p in server.items()
            if key not in stored
            or stored[key] != decoded_part(p)
            or pod_info(stored[key], GPU_RESOURCE) != pod_info(p, GPU_RESOURCE)
        }
        out |= {key: (None, obj) for key, obj in informer.store.items() if key not in server}
        return out if len(server) == 6 else {"pods": len(server), **out}

    async def alike() -> bool:
        return not await differences()

    def core(conditions: list[JsonObject]) -> list[JsonObject]:
        return [{k: c[k] for k in ("type", "status", "reason") if k in c} for c in conditions]

    async def conditions_alike(name: str) -> bool:
        status = (await kube.get(PODS, name, namespace=namespace))["status"]
        stored = informer.store[f"{namespace}/{name}"]["status"].get("conditions") or []
        return bool(status["conditions"]) and core(stored) == core(status["conditions"])

    try:
        await asyncio.wait_for(informer.synced.wait(), 20)
        await kube.create(PODS, gpu_pod("watched", namespace), namespace=namespace)
        await kube.create(PODS, gpu_pod("plain", namespace, annotations={}), namespace=namespace)
        await kube.create(PODS, rich_pod("watched-rich", namespace, *owners), namespace=namespace)
        conditions = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
        await patch_status(
            kube,
            PODS,
            "watched",
            {"nominatedNodeName": "gpu-1", "conditions": conditions},
            namespace=namespace,
        )
        unschedulable = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/3 nodes are available: 3 fragmented: no NUMA node with 4 free GPUs, "
            f"Insufficient {GPU_RESOURCE}.",
            "lastTransitionTime": "2026-12-01T10:05:07Z",
        }
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:06:00Z"}
        generated = "watched-rich-scratch-q2"
        await patch_status(
            kube,
            PODS,
            "watched-rich",
            {
                "conditions": [unschedulable, ready],
                "startTime": "2026-12-01T10:00:00Z",
                "resourceClaimStatuses": [{"name": "scratch", "resourceClaimName": generated}],
            },
            namespace=namespace,
        )
        with contextlib.suppress(AssertionError):
            await eventually(alike)
        found = await differences()
        for key, (want, got) in found.items() if "pods" not in found else ():
            print("DIFF", key, json.dumps(want, sort_keys=True), json.dumps(got, sort_keys=True), sep="\n")
        assert found == {}
        info = pod_info(informer.store[f"{namespace}/watched"], GPU_RESOURCE)
        assert (info.gpus, info.nominated, info.gpu_ids) == (5, "gpu-1", ("0", "1"))
        # The disruption controller may reset our condition to False meanwhile; either way the protobuf
        # path carries the server's conditions.
        await eventually(lambda: conditions_alike("watched"))
        assert pod_info(informer.store[f"{namespace}/going"], GPU_RESOURCE).terminating
        rich = informer.store[f"{namespace}/watched-rich"]
        assert rich["metadata"]["ownerReferences"][0]["controller"] is True
        assert rich["metadata"]["labels"]["pod-template-hash"] == "7d9c5b8f4"
        assert {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 300} in rich["spec"]["tolerations"]  # fmt: skip
        assert rich["status"]["startTime"] == "2026-12-01T10:00:00Z"
        assert rich["status"]["conditions"][0]["message"] == unschedulable["message"]
        assert claim_names(rich) == claim_names(server[f"{namespace}/watched-rich"])
        assert claim_names(rich) == ("watched-rich-gpus", generated)
        assert "managedFields" not in informer.store[f"{namespace}/listed"]["metadata"]  # only what is read
        assert informer.lists == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(KubeNotFound):
            await kube.patch(PODS, "going", {"metadata": {"finalizers": None}}, namespace=namespace)


# ------------------------------------------------------------------------------------------ patches
async def test_patch_types_and_status_subresource(kube: KubeClient, node: str) -> None:
    merged = await kube.patch(NODES, node, {"metadata": {"labels": {"gpuwarden.io/pool": "h100"}}})
    assert merged["metadata"]["labels"]["gpuwarden.io/pool"] == "h100"
    assert merged["metadata"]["labels"]["e2e"] == "kube"  # merge patch keeps the rest

    key = "gpuwarden.io/quarantine"
    ops = [
        {"op": "add", "path": json_pointer("metadata", "annotations"), "value": {}},
        {"op": "add", "path": json_pointer("metadata", "annotations", key), "value": '{"xid": 79}'},
    ]
    patched = await kube.patch(NODES, node, ops, patch_type=PatchType.JSON)
    assert patched["metadata"]["annotations"][key] == '{"xid": 79}'

    # kwok marks a new Node Ready asynchronously; the merge below is observable only once that exists.
    async def kwok_marked_ready() -> bool:
        current = (await kube.get(NODES, node)).get("status", {})
        return "Ready" in {c["type"] for c in current.get("conditions") or []}

    await eventually(kwok_marked_ready, within=60.0)

    condition = {
        "type": "GPUHealthy",
        "status": "False",
        "reason": "XID79",
        "message": "GPU fell off the bus",
    }
    await patch_status(kube, NODES, node, {"conditions": [condition]}, patch_type=PatchType.STRATEGIC)
    status = (await kube.get(NODES, node))["status"]
    types = {c["type"] for c in status["conditions"]}
    assert "GPUHealthy" in types
    assert "Ready" in types  # strategic merge merged by condition type instead of replacing the list

    # The same change sent to the main resource is ignored: status is only writable via the subresource.
    ignored = {"status": {"conditions": [{**condition, "type": "MainResourceWrite", "status": "True"}]}}
    after = await kube.patch(NODES, node, ignored, patch_type=PatchType.STRATEGIC)
    assert "MainResourceWrite" not in {c["type"] for c in after["status"]["conditions"]}


@pytest.mark.parametrize(
    ("patch_type", "patch"),
    [
        pytest.param(PatchType.MERGE, {"metadata": {"labels": {"x": "1"}}}, id="merge"),
        pytest.param(PatchType.STRATEGIC, {"metadata": {"labels": {"x": "1"}}}, id="strategic"),
        pytest.param(PatchType.JSON, [{"op": "add", "path": "/metadata/labels/x", "value": "1"}], id="json"),
    ],
)
async def test_stale_precondition_is_a_conflict(
    kube: KubeClient, node: str, patch_type: PatchType, patch: Any
) -> None:
    stale = (await kube.get(NODES, node))["metadata"]["resourceVersion"]
    await kube.patch(NODES, node, {"metadata": {"labels": {"moved": "on"}}})
    with pytest.raises(KubeConflict):
        await kube.patch(NODES, node, with_precondition(patch, patch_type, stale), patch_type=patch_type)
    # Conditioned on a fresh read it goes through (kwok and the controller-manager also write this Node, so
    # even a fresh read can be overtaken: that is what the retry is for).
    written = await patch_with_retry(kube, NODES, node, lambda _current: patch, patch_type=patch_type)
    assert written["metadata"]["labels"]["x"] == "1"


async def test_two_concurrent_writers_lose_no_update(
    kube: KubeClient, node: str, registry: CollectorRegistry
) -> None:
    per_writer = 8
    both_read = asyncio.Barrier(2)

    async def writer(label: str, patch_type: PatchType) -> None:
        meet = [True]  # only each writer's very first read waits for the other's
        for i in range(per_writer):

            async def compute(current: dict[str, Any], n: int = i) -> Any:
                count = int((current["metadata"].get("annotations") or {}).get("e2e/count", "0"))
                if meet:
                    meet.clear()
                    # Both writers have read the same version, so exactly one of the two writes conflicts.
                    await asyncio.wait_for(both_read.wait(), 10)
                if patch_type is PatchType.JSON:
                    value = {**(current["metadata"].get("annotations") or {}), "e2e/count": str(count + 1)}
                    return [{"op": "add", "path": "/metadata/annotations", "value": value}]
                return {"metadata": {"annotations": {"e2e/count": str(count + 1), f"e2e/{label}": str(n)}}}

            await patch_with_retry(kube, NODES, node, compute, patch_type=patch_type, attempts=20)

    await asyncio.gather(writer("a", PatchType.MERGE), writer("b", PatchType.JSON))
    final = await kube.get(NODES, node)
    assert final["metadata"]["annotations"]["e2e/count"] == str(2 * per_writer)
    assert requests(registry, "patch", "nodes", "conflict") >= 1


# ------------------------------------------------------------------------------------------ events
async def test_event_is_recorded_and_repeats_become_a_series(kube: KubeClient, node: str) -> None:
    target = await kube.get(NODES, node)
    recorder = EventRecorder(kube, component="e2e", instance="e2e-0")
    first = await recorder.emit(
        target, reason="GPUQuarantined", note="XID 79 on GPU-0", action="Quarantine", type=EventType.WARNING
    )
    assert first is not None
    name, namespace = first["metadata"]["name"], first["metadata"]["namespace"]
    assert namespace == "default"
    stored = await kube.get(EVENTS, name, namespace=namespace)
    assert stored["regarding"]["name"] == node and stored["regarding"]["kind"] == "Node"
    assert stored["regarding"]["uid"] == target["metadata"]["uid"]
    assert (stored["reason"], stored["type"], stored["action"]) == ("GPUQuarantined", "Warning", "Quarantine")
    assert stored["reportingController"] == "gpuwarden.io/e2e"
    assert stored["reportingInstance"] == "e2e-0"

    await recorder.emit(
        target, reason="GPUQuarantined", note="XID 79 on GPU-0", action="Quarantine", type=EventType.WARNING
    )
    again = await kube.get(EVENTS, name, namespace=namespace)
    assert again["series"]["count"] == 2

    # The same event is visible through the core/v1 Events API that `kubectl describe node` reads.
    core = Resource("", "v1", "events", "Event", namespaced=True)
    listed = await kube.list_objects(core, namespace="default", field_selector=f"involvedObject.name={node}")
    assert any(e["reason"] == "GPUQuarantined" for e in listed.items)


# ------------------------------------------------------------------------------------------ leader election
async def test_two_electors_exactly_one_leads_and_release_hands_over_quickly(
    kube: KubeClient, namespace: str, registry: CollectorRegistry
) -> None:
    durations = LeaseDurations(lease_duration=4, renew_deadline=3, retry_period=0.2)
    electors = [
        LeaderElector(
            kube,
            name="gpuwarden-e2e",
            namespace=namespace,
            identity=ident,
            durations=durations,
            registry=registry,
        )
        for ident in ("replica-a", "replica-b")
    ]
    tasks = [asyncio.create_task(e.run()) for e in electors]
    try:
        await eventually(lambda: any(e.is_leader.is_set() for e in electors))
        for _ in range(30):  # 1.5 s of renewals: never two leaders, never none
            assert sum(e.is_leader.is_set() for e in electors) == 1
            await asyncio.sleep(0.05)
        leader = next(e for e in electors if e.is_leader.is_set())
        standby = next(e for e in electors if e is not leader)
        lease = await kube.get(LEASES, "gpuwarden-e2e", namespace=namespace)
        assert lease["spec"]["holderIdentity"] == leader.identity
        transitions = lease["spec"]["leaseTransitions"]

        leader.stop()
        await asyncio.wait_for(tasks[electors.index(leader)], 5)
        started = time.monotonic()
        await asyncio.wait_for(standby.is_leader.wait(), durations.lease_duration)
        handover = time.monotonic() - started
        assert handover < 1.0, f"handover took {handover:.2f}s; a released lease must not wait out 4s"
        assert not leader.is_leader.is_set()
        lease = await kube.get(LEASES, "gpuwarden-e2e", namespace=namespace)
        assert lease["spec"]["holderIdentity"] == standby.identity
        assert lease["spec"]["leaseTransitions"] == transitions + 1
        gauge = registry.get_sample_value("gpuwarden_leader", {"lease": f"{namespace}/gpuwarden-e2e"})
        assert gauge == 1
    finally:
        for e in electors:
            e.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    lease = await kube.get(LEASES, "gpuwarden-e2e", namespace=namespace)
    assert not lease["spec"].get("holderIdentity")  # released on shutdown
