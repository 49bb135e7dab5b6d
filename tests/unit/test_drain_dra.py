"""GPU-precise drain on DRA-backed nodes: the faulty device (the quarantine record's `devices`) mapped to the
pods whose ResourceClaims hold it - scope table, the snapshot from raw objects, the claims' read."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from controller.drain.loop import DrainLoop, read_claims
from controller.drain.observe import build_snapshot, device_scoped
from controller.drain.plan import DrainNode, DrainPod, in_scope
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeNotFound, KubeUnreachable
from gpuwarden.kube.resources import ObjectList
from gpuwarden.quarantine import DeviceRef
from gpuwarden.wellknown import QUARANTINE_RECORD, QUARANTINE_TAINT
from tests.unit.test_health_fixtures import record

D = "gpu.nvidia.com"


def dev(i: int) -> DeviceRef:
    return DeviceRef(D, "n1", f"gpu-{i}")


FAULTY = DeviceRef(D, "n1", "gpu-2", "GPU-n1-2")  # the record's device carries its UUID, claims do not


def pod(name: str, devices: set[int] | None, *, gpus: int = 1, claims: bool = True) -> DrainPod:
    held = frozenset(dev(i) for i in devices) if devices is not None else None
    return DrainPod("train", name, f"uid-{name}", None, gpus, claims=claims, devices=held)


DRA_NODE = DrainNode("n1", frozenset({"GPU-n1-2"}), {}, fault_devices=(FAULTY,), dra=True)


@pytest.mark.parametrize(
    ("pods", "scope", "moved"),
    [
        pytest.param([pod("a", {2, 3}), pod("b", {4, 5})], "gpu", ["a"], id="only-the-holder-of-the-device"),
        pytest.param([pod("a", {0}), pod("b", {1})], "gpu", [], id="nobody-holds-it"),
        pytest.param([pod("a", {2}, gpus=0)], "gpu", ["a"], id="explicit-claim-without-gpu-request"),
        pytest.param([pod("a", {2}), pod("b", None)], "node", ["a", "b"], id="an-unread-claim-widens"),
        pytest.param(
            [pod("a", {2}), pod("cpu", set(), gpus=0, claims=False)], "gpu", ["a"], id="cpu-pods-never"
        ),
    ],
)
def test_scope_on_a_dra_node(pods: list[DrainPod], scope: str, moved: list[str]) -> None:
    got_scope, got = in_scope(DRA_NODE, pods)
    assert (got_scope, [p.name for p in got]) == (scope, moved)


def test_node_level_quarantine_of_a_dra_node_moves_claim_holders_too() -> None:
    fallback = DrainNode("n1", frozenset({"GPU-n1-2"}), {}, dra=True)
    pods = [pod("a", {2}, gpus=0), pod("b", None), pod("cpu", set(), gpus=0, claims=False)]
    assert in_scope(fallback, pods) == ("node", pods[:2])


def test_another_pool_same_device_name_is_not_the_faulty_one() -> None:
    other = replace(pod("a", set()), devices=frozenset({DeviceRef(D, "n2", "gpu-2")}))
    assert in_scope(DRA_NODE, [other]) == ("gpu", [])


# --- from raw objects ---------------------------------------------------------------------------------------

DEVICE_RECORD = replace(record(node_name="n1", gpu_index=2), effect="PreferNoSchedule", devices=(FAULTY,))


def node_obj(name: str = "n1", rec: Any = DEVICE_RECORD) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {QUARANTINE_RECORD: rec.encode()}},
        "spec": {"taints": [{"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "PreferNoSchedule"}]},
        "status": {"allocatable": {}},
    }


def pod_obj(name: str, claim: str, *, extended: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": "n1", "containers": [{"name": "c"}]}
    status: dict[str, Any] = {"phase": "Running"}
    if extended:  # nvidia.com/gpu served by DRA: the scheduler's claim
        spec["containers"][0]["resources"] = {
            "requests": {"nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"},
        }
        status["extendedResourceClaimStatus"] = {"resourceClaimName": claim, "requestMappings": []}
    else:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    return {
        "metadata": {"namespace": "train", "name": name, "uid": f"uid-{name}"},
        "spec": spec,
        "status": status,
    }


def claim_obj(name: str, device: str) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": D, "pool": "n1", "device": device}]
    return {
        "metadata": {"namespace": "train", "name": name},
        "status": {"allocation": {"devices": {"results": results}}},
    }


PODS = [pod_obj("holder", "c-holder", extended=True), pod_obj("other", "c-other")]
CLAIMS = {
    ("train", "c-holder"): claim_obj("c-holder", "gpu-2"),
    ("train", "c-other"): claim_obj("c-other", "gpu-5"),
}


def test_snapshot_maps_the_faulty_device_to_its_holder() -> None:
    snap = build_snapshot([node_obj()], PODS, resource="nvidia.com/gpu", claims=CLAIMS)
    (n,) = snap.nodes
    assert n.fault_devices == (FAULTY,)
    assert [p.name for p in in_scope(n, snap.pods_by_node["n1"])[1]] == ["holder"]


def test_snapshot_without_claims_drains_node_wide() -> None:
    snap = build_snapshot([node_obj()], PODS, resource="nvidia.com/gpu", claims=None)
    (n,) = snap.nodes
    assert in_scope(n, snap.pods_by_node["n1"])[0] == "node"


def test_node_level_record_keeps_todays_path() -> None:
    rec = record(node_name="n1", gpu_index=2)
    assert device_scoped([node_obj(rec=rec)]) == set()
    assert device_scoped([node_obj()]) == {"n1"}
    (plain,) = build_snapshot([node_obj(rec=rec)], PODS, resource="nvidia.com/gpu").nodes
    assert not plain.dra and plain.fault_devices == ()
    fallback = replace(rec, scope_note="DeviceTaintRule resource.k8s.io/v1 not served (404)")
    (dra,) = build_snapshot([node_obj(rec=fallback)], PODS, resource="nvidia.com/gpu").nodes
    assert dra.dra and dra.fault_devices == ()


class Claims:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.asked = fail, []  # type: list[str | None]

    async def list_objects(self, resource: Any, **kw: Any) -> ObjectList:
        self.asked.append(kw.get("namespace"))
        if self.fail:
            raise KubeUnreachable("connection refused")
        return ObjectList(items=list(CLAIMS.values()), resource_version="1")


def test_claims_are_read_only_where_a_quarantine_is_device_scoped() -> None:
    kube = Claims()
    assert asyncio.run(read_claims(kube, [node_obj(rec=record())], PODS, 500)) is None  # type: ignore[arg-type]
    assert kube.asked == []
    assert asyncio.run(read_claims(kube, [node_obj()], PODS, 500)) == CLAIMS  # type: ignore[arg-type]
    assert kube.asked == ["train"]
    assert asyncio.run(read_claims(Claims(fail=True), [node_obj()], PODS, 500)) is None  # type: ignore[arg-type]


class Classes:
    def __init__(self, answer: list[dict[str, Any]] | Exception) -> None:
        self.answer = answer

    async def list_objects(self, resource: Any, **kw: Any) -> ObjectList:
        if isinstance(self.answer, Exception):
            raise self.answer
        return ObjectList(items=self.answer, resource_version="1")


GPU_CLASS = {"metadata": {"name": "gpu.example.com"}, "spec": {"extendedResourceName": "nvidia.com/gpu"}}


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ([GPU_CLASS], {"nvidia.com/gpu": "gpu.example.com"}),
        ([], {}),
        (KubeNotFound("resource.k8s.io/v1 not served"), {}),  # no DRA API: no DRA-backed node
        (KubeUnreachable("connection refused"), None),  # not read: not "no DRA"
    ],
)
def test_the_drain_loop_reads_which_resources_dra_serves(answer: Any, want: dict[str, str] | None) -> None:
    loop = DrainLoop(Config(), Classes(answer))  # type: ignore[arg-type]
    assert asyncio.run(loop.dra_classes()) == want
