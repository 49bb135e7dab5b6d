"""The controller's shared live-pod informer reads pods as protobuf, decoded by `podproto` to the fields its
readers read. Here, on pods shaped as the API server's JSON (owner references, labels, tolerations,
nodeSelector, DRA claims, condition messages and times):

- the decoded pod equals the JSON pod on every path the subset message holds, value for value;
- every reader (`pod_info`, drain, idle, nominations, make-room, the preemption signals, the DRA claim
  names) gives the same answer from either;
- no reader reads a path the subset message does not hold: each reader runs over pods that record every key
  they are asked for, and the recorded paths must all be decoded ones. A reader that starts reading a new
  pod field fails this test until podpb/pod.proto and podproto.py decode it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor

from controller.drain.loop import plan_from as drain_plan_from
from controller.drain.observe import drain_pod
from controller.gpus.devices import claim_names, pod_devices
from controller.gpus.objects import pod_info
from controller.gpus.podpb.pod_pb2 import Pod
from controller.gpus.podproto import pod_object
from controller.idle.loop import plan_from as idle_plan_from
from controller.idle.query import GpuUsage
from controller.idle.snapshot import idle_pod
from controller.makeroom.complete import victim_state, waiting
from controller.makeroom.loop import plan_from as room_plan_from
from controller.makeroom.plan import (
    FRAGMENTED_MARKER,
    Pending,
    _shape,
    budgets_from,
    candidate,
    node_facts,
    usable,
)
from controller.nominations.loop import plan_from as nominations_plan_from
from controller.nominations.snapshot import pending_pod
from controller.preemption.record import making_room, record_of, verb_pending
from controller.preemption.signals import pod_meta, preempted_at, terminating_by_preemption, workload_of
from gpuwarden.config.root import Config
from gpuwarden.wellknown import GPU_IDS, IDLE_RECLAIMABLE
from tests.unit.extender_support import RESOURCE, node, quarantine_record
from tests.unit.podproto_support import decoded_part, decoded_paths, is_path_end, pod_bytes

T0 = "2026-12-01T10:00:00Z"
T1 = "2026-12-01T10:05:07Z"
NOW = 1_800_000_000.0  # long after T0: every pending pod has waited long enough
NODES = [
    node("gpu-1", quarantine=quarantine_record("0", "1"), taint="xid-79"),
    node("gpu-2"),
    {**node("gpu-3"), "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}},
]
for _n in NODES:
    _n["metadata"]["labels"] = {"gpu": "h100", "kubernetes.io/hostname": _n["metadata"]["name"]}
PDBS = [
    {
        "metadata": {"name": "web", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 1},
    }
]


def _container(gpus: int) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "trainer:v1",
        "env": [{"name": "HOME", "value": "/root"}],
        "resources": {
            "limits": {RESOURCE: str(gpus), "cpu": "4"},
            "requests": {RESOURCE: str(gpus), "cpu": "4"},
        },
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }


def _condition(kind: str, status: str, when: str | None = T0, **extra: str) -> dict[str, Any]:
    """As the API server writes a PodCondition: type, status and both times always (a zero Time as null)."""
    return {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": when, **extra}


def server_pod(
    name: str,
    *,
    gpus: int = 2,
    node_name: str = "",
    phase: str = "Pending",
    owners: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A v1.Pod in the API server's JSON shape, with fields no reader reads (managedFields, volumes, ...)."""
    metadata: dict[str, Any] = {
        "name": name,
        "generateName": name.rsplit("-", 1)[0] + "-",
        "namespace": "ml",
        "uid": f"uid-{name}",
        "resourceVersion": "4711",
        "creationTimestamp": T0,
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "time": T0}],
        **({"labels": labels} if labels else {}),
        **({"annotations": annotations} if annotations else {}),
        **({"ownerReferences": owners} if owners else {}),
        **(meta or {}),
    }
    pod_spec: dict[str, Any] = {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [_container(gpus)],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        **({"nodeName": node_name} if node_name else {}),
        **(spec or {}),
    }
    pod_status: dict[str, Any] = {
        "phase": phase,
        "qosClass": "Guaranteed",
        **({"conditions": conditions} if conditions else {}),
        **(status or {}),
    }
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata, "spec": pod_spec, "status": pod_status}


def owner(kind: str, name: str, *, controller: bool | None = True, api: str = "apps/v1") -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{name}"}
    if controller is not None:
        ref["controller"] = controller
        ref["blockOwnerDeletion"] = True
    return ref


UNSCHEDULABLE = (
    f"0/3 nodes are available: 2 {FRAGMENTED_MARKER} no NUMA node with 4 free GPUs, "
    f"1 Insufficient {RESOURCE}."
)
PODS = {
    "deployment-on-quarantined-node": server_pod(
        "web-7d9c5b8f4-abcde",
        node_name="gpu-1",
        phase="Running",
        owners=[owner("ReplicaSet", "web-7d9c5b8f4")],
        labels={"app": "web", "pod-template-hash": "7d9c5b8f4", "team": "a"},
        annotations={GPU_IDS: "0,1", IDLE_RECLAIMABLE: "true"},
        conditions=[_condition("PodScheduled", "True"), _condition("Ready", "True", T1)],
        spec={
            "nodeSelector": {"gpu": "h100"},
            "priority": 100,
            "resourceClaims": [
                {"name": "gpu", "resourceClaimName": "web-gpu"},
                {"name": "tpl", "resourceClaimTemplateName": "gpu-template"},
            ],
        },
        status={
            "startTime": T0,
            "hostIP": "10.0.0.1",
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0}],
            "resourceClaimStatuses": [{"name": "tpl", "resourceClaimName": "web-tpl-x7"}],
            "extendedResourceClaimStatus": {
                "requestMappings": [{"containerName": "main", "resourceName": RESOURCE, "requestName": "r0"}],
                "resourceClaimName": "web-extended-q2",
            },
        },
    ),
    "daemonset-pod": server_pod(
        "dcgm-exporter-k2p4q",
        gpus=0,
        node_name="gpu-1",
        phase="Running",
        owners=[owner("DaemonSet", "dcgm-exporter")],
        labels={"app": "dcgm-exporter"},
        conditions=[_condition("Ready", "True")],
        status={"startTime": T0},
    ),
    "unschedulable-fragmented": server_pod(
        "train-q8zrw",
        gpus=4,
        owners=[owner("Job", "train", api="batch/v1")],
        labels={"job-name": "train"},
        conditions=[_condition("PodScheduled", "False", T1, reason="Unschedulable", message=UNSCHEDULABLE)],
        spec={
            "priority": 1000,
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                {"operator": "Exists", "effect": "NoExecute"},
            ],
        },
    ),
    "unschedulable-short-of-gpus": server_pod(
        "solo",
        gpus=8,
        conditions=[
            _condition(
                "PodScheduled", "False", None, reason="Unschedulable", message=f"Insufficient {RESOURCE}"
            )
        ],
    ),
    "nominated-not-controlled": server_pod(
        "batch-0",
        owners=[owner("StatefulSet", "batch", controller=False)],
        labels={"app": "batch"},
        conditions=[_condition("PodScheduled", "False", reason="Unschedulable", message="preempting")],
        status={"nominatedNodeName": "gpu-2"},
    ),
    "preemption-victim-terminating": server_pod(
        "db-0",
        node_name="gpu-2",
        phase="Running",
        owners=[owner("StatefulSet", "db")],
        labels={"app": "web"},
        annotations={GPU_IDS: "2,3"},
        conditions=[
            _condition(
                "DisruptionTarget",
                "True",
                T1,
                reason="PreemptionByScheduler",
                message="Kubernetes default scheduler: preempting",
            )
        ],
        meta={"deletionTimestamp": T1, "deletionGracePeriodSeconds": 30},
        status={"startTime": T0},
    ),
    "bare-running": server_pod("bare", node_name="gpu-2", phase="Running", status={"startTime": T1}),
}
CASES = [pytest.param(obj, id=name) for name, obj in PODS.items()]


def decoded(obj: dict[str, Any]) -> dict[str, Any]:
    return pod_object(pod_bytes(obj))


@pytest.mark.parametrize("obj", CASES)
def test_the_decoded_pod_is_the_json_pod_on_every_decoded_path(obj: dict[str, Any]) -> None:
    assert decoded(obj) == decoded_part(obj)


def test_the_decoded_shape_is_the_api_servers_json() -> None:
    """Spelled out once: times to the second with Z, booleans, tolerationSeconds an int, a zero condition
    time as null, empty strings left out, and only the decoded part of the extended claim status."""
    obj = decoded(PODS["deployment-on-quarantined-node"])
    assert obj["metadata"]["creationTimestamp"] == "2026-12-01T10:00:00Z"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c5b8f4", "uid": "uid-web-7d9c5b8f4",
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert obj["spec"]["tolerations"][0] == {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    assert obj["status"]["conditions"][1] == {"type": "Ready", "status": "True", "lastTransitionTime": T1}
    assert obj["status"]["extendedResourceClaimStatus"] == {"resourceClaimName": "web-extended-q2"}
    assert decoded(PODS["unschedulable-fragmented"])["spec"]["tolerations"][1] == {
        "operator": "Exists",
        "effect": "NoExecute",
    }
    zero = decoded(PODS["unschedulable-short-of-gpus"])["status"]["conditions"][0]
    assert zero["lastTransitionTime"] is None
    refs = decoded(PODS["nominated-not-controlled"])["metadata"]["ownerReferences"]
    assert refs[0]["controller"] is False
    assert (
        "controller"
        not in decoded(server_pod("x", owners=[owner("Job", "j", controller=None)]))["metadata"][
            "ownerReferences"
        ][0]
    )


# ------------------------------------------------------------------------------------------ the readers
CONFIG = Config()


def _candidate(obj: Any) -> Any:
    got = candidate(obj, pod_info(obj, RESOURCE), NOW, 60, 300, [], RESOURCE)
    if isinstance(got, Pending):  # its spec is the raw object's: compared through what the plan reads of it
        shapes = _shape(got, None)
        return (got.pod, got.since, got.idle_only, shapes, [usable(got.spec, node_facts(n)) for n in NODES])
    return got


READERS: dict[str, Callable[[Any], Any]] = {
    "pod_info": lambda o: pod_info(o, RESOURCE),
    "drain_pod": lambda o: drain_pod(o, RESOURCE, {}),
    "claim_names": claim_names,
    "pod_devices": lambda o: pod_devices(o, {}),
    "idle_pod": lambda o: idle_pod(o, RESOURCE),
    "pending_pod": lambda o: pending_pod(o, RESOURCE),
    "pod_meta": pod_meta,
    "workload_of": workload_of,
    "preempted_at": preempted_at,
    "terminating_by_preemption": terminating_by_preemption,
    "record_of": record_of,
    "making_room": lambda o: making_room(o, NOW),
    "verb_pending": lambda o: verb_pending(o, NOW),
    "makeroom_candidate": _candidate,
    "budgets_from": lambda o: budgets_from(PDBS, [o]),
    "victim_state": lambda o: victim_state(o, o["metadata"]["uid"]),
    "waiting": waiting,
}
# The readers' whole passes over every pod at once (what the loops run on the informer's pods).
PASSES: dict[str, Callable[[list[Any]], Any]] = {
    "drain": lambda pods: drain_plan_from(CONFIG, copy.deepcopy(NODES), pods, now=NOW, claims={}),
    "nominations": lambda pods: nominations_plan_from(CONFIG, pods, copy.deepcopy(NODES), now=NOW),
    "makeroom": lambda pods: room_plan_from(CONFIG, copy.deepcopy(NODES), pods, PDBS, now=NOW),
    "idle": lambda pods: idle_plan_from(
        CONFIG, pods, [GpuUsage("gpu-1", g, "ml", "web-7d9c5b8f4-abcde", 0.0, 30) for g in "01"], now=NOW
    ),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("obj", CASES)
def test_every_reader_reads_the_same_from_either(obj: dict[str, Any], reader: str) -> None:
    read = READERS[reader]
    assert read(decoded(obj)) == read(obj)


@pytest.mark.parametrize("name", PASSES)
def test_every_pass_plans_the_same_from_either(name: str) -> None:
    run = PASSES[name]
    as_json = [copy.deepcopy(o) for o in PODS.values()]
    assert run([decoded(o) for o in PODS.values()]) == run(as_json)


def test_the_pods_reach_the_readers_deep_paths() -> None:
    """The comparisons above are worth something only if the pods drive the readers to the fields at
    stake: the drain sees the DaemonSet, make-room the fragmented verdict and its tolerations, idle the
    owner and start time, nominations the nominated pod, the claims their names."""
    pods = {name: decoded(o) for name, o in PODS.items()}
    assert drain_pod(pods["daemonset-pod"], RESOURCE).owner_kinds == ("DaemonSet",)
    assert claim_names(pods["deployment-on-quarantined-node"]) == ("web-extended-q2", "web-gpu", "web-tpl-x7")
    fragmented = _candidate(pods["unschedulable-fragmented"])
    assert not isinstance(fragmented, str) and fragmented[2] is False  # fragmented, not only short of GPUs
    assert fragmented[4] == [False, True, True]  # gpu-1 quarantined; gpu-3's taint tolerated
    assert not isinstance(_candidate(pods["unschedulable-short-of-gpus"]), str)
    idle = idle_pod(pods["deployment-on-quarantined-node"], RESOURCE)
    assert idle is not None and idle.owner is not None and idle.owner.kind == "ReplicaSet" and idle.started
    assert workload_of(pods["deployment-on-quarantined-node"]).kind == "Deployment"
    assert pod_meta(pods["bare-running"]).created is not None
    assert preempted_at(pods["preemption-victim-terminating"])
    nominated = pending_pod(pods["nominated-not-controlled"], RESOURCE)
    assert nominated is not None and not nominated.owned
    assert budgets_from(PDBS, pods.values()).covering == {
        "ml/web-7d9c5b8f4-abcde": ("ml/web",),
        "ml/db-0": ("ml/web",),
    }


# ------------------------------------------------------------------------------------------ paths read
DECODED = frozenset(decoded_paths())


class Recording(dict[str, Any]):
    """A JSON object that writes down the path of every key it is asked for (present or not). Below a
    decoded path's end (inside labels, a Quantity map, ...) nothing more is written down."""

    def __init__(
        self, value: dict[str, Any], message: Descriptor, path: tuple[str, ...], log: set[Any]
    ) -> None:
        super().__init__()
        self._message, self._path, self._log = message, path, log
        for key, item in value.items():
            dict.__setitem__(self, key, self._wrap(key, item))

    def _wrap(self, key: str, item: Any) -> Any:
        f = self._message.fields_by_name.get(key)
        if f is None or is_path_end(f):
            return item
        path = (*self._path, key)
        if isinstance(item, list):
            return [Recording(x, f.message_type, path, self._log) if isinstance(x, dict) else x for x in item]
        return Recording(item, f.message_type, path, self._log) if isinstance(item, dict) else item

    def _read(self, key: object) -> None:
        self._log.add((*self._path, key))

    def __getitem__(self, key: str) -> Any:
        self._read(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self._read(key)
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        self._read(key)
        return dict.__contains__(self, key)

    def _all(self) -> None:
        for key in dict.keys(self):
            self._read(key)

    def __iter__(self) -> Iterator[str]:
        self._all()
        return dict.__iter__(self)

    def items(self) -> Any:
        self._all()
        return dict.items(self)

    def values(self) -> Any:
        self._all()
        return dict.values(self)

    def keys(self) -> Any:
        self._all()
        return dict.keys(self)


def recorded(obj: dict[str, Any], log: set[Any]) -> Recording:
    return Recording(copy.deepcopy(obj), Pod.DESCRIPTOR, (), log)


def paths_read(run: Callable[[list[Any]], Any]) -> set[tuple[str, ...]]:
    log: set[Any] = set()
    run([recorded(o, log) for o in PODS.values()])
    return log


@pytest.mark.parametrize("reader", READERS)
def test_no_reader_reads_a_path_podproto_does_not_decode(reader: str) -> None:
    read = READERS[reader]
    assert paths_read(lambda pods: [read(p) for p in pods]) - DECODED == set()


@pytest.mark.parametrize("name", PASSES)
def test_no_pass_reads_a_path_podproto_does_not_decode(name: str) -> None:
    assert paths_read(PASSES[name]) - DECODED == set()


def test_the_recording_sees_what_a_reader_reads() -> None:
    """The test above can fail: a reader of fields podproto leaves out is caught, in a list and at the top."""

    def host_and_images(pods: list[Any]) -> None:
        for p in pods:
            (p.get("status") or {}).get("hostIP")
            [c.get("image") for c in p["spec"]["containers"]]
            p.get("kind")

    read = paths_read(host_and_images)
    assert read - DECODED == {("status", "hostIP"), ("spec", "containers", "image"), ("kind",)}
    labels = paths_read(lambda pods: [dict(p["metadata"].get("labels") or {}) for p in pods])
    assert labels == {("metadata",), ("metadata", "labels")}  # a map is read whole
