"""The demo's expected-outcome probes on hand-built cluster state: what passes, what fails, what they say."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from gpuwarden.kube import ObjectList
from gpuwarden.promtypes import Sample, Vector
from harness.demo import scenario as sc
from harness.demo.checks import Checks
from harness.demo.observer import ClusterView
from harness.demo.processes import ProcessFailed
from harness.demo.timeline import Timeline

FLEET = sc.Fleet(nodes=3)


class FakeKube:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    async def list_objects(self, _resource: Any, *, namespace: str | None = None) -> ObjectList:
        items = [e for e in self.events if namespace in (None, e["regarding"].get("namespace"))]
        return ObjectList(items, "1")


class FakeProm:
    def __init__(self, series: dict[str, list[dict[str, str]]]) -> None:
        self.series = series

    async def query(self, promql: str) -> Vector:
        """Every series of the first metric named in `promql`, valued 1 unless its labels give `__value__`."""
        metric = next((m for m in self.series if m in promql), "")
        return Vector(
            [
                Sample(
                    {k: v for k, v in labels.items() if k != "__value__"},
                    0.0,
                    float(labels.get("__value__", 1)),
                )
                for labels in self.series.get(metric, [])
            ]
        )


def kubectl_printing(text: str) -> Any:
    def run(*args: str) -> str:
        assert args[:2] == ("top", "pods"), args
        return text

    return run


def kubectl_failing(*args: str) -> str:
    raise RuntimeError("kubectl top pods failed (rc=1): error: Metrics API not available")


def pod(
    name: str,
    ns: str = "t",
    app: str = "w",
    node: str = "",
    gpus: str = "",
    numa: str = "",
    nominated: str = "",
    deleting: bool = False,
) -> dict[str, Any]:
    annotations = {k: v for k, v in (("gpuwarden.io/gpu-ids", gpus), ("gpuwarden.io/numa-node", numa)) if v}
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": {"app": app}, "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


def node(name: str, taint: str = "", healthy: str = "", record: bool = False) -> dict[str, Any]:
    spec = (
        {"taints": [{"key": "gpuwarden.io/gpu-unhealthy", "value": taint, "effect": "NoSchedule"}]}
        if taint
        else {}
    )
    annotations = {"gpuwarden.io/quarantine": "{}"} if record else {}
    conditions = [{"type": "GPUHealthy", "status": healthy}] if healthy else []
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def failed_gpu_node(name: str, failed: int) -> dict[str, Any]:
    """Quarantined for XID 79 on GPU `failed`, with the topology annotation mapping UUIDs to indices."""
    topology = {str(i): {"numa": i // 4, "uuid": f"GPU-{name}-{i}"} for i in range(8)}
    record = {
        "state": "quarantined",
        "reason": "xid-79",
        "evidence": [{"reason": "xid-79", "gpu": f"GPU-{name}-{failed}"}],
    }
    out = node(name, "xid-79", "False")
    out["metadata"]["annotations"] = {
        "gpuwarden.io/quarantine": json.dumps(record),
        "gpuwarden.io/gpu-topology": json.dumps(topology),
    }
    return out


def event(reason: str, name: str, ns: str = "t", note: str = "n") -> dict[str, Any]:
    return {"reason": reason, "note": note, "regarding": {"name": name, "namespace": ns}}


def hpa_event(note: str, hpa: str = "w") -> dict[str, Any]:
    """kube-controller-manager's Event on an HPA that rescaled its target."""
    regarding = {"kind": "HorizontalPodAutoscaler", "name": hpa, "namespace": "t"}
    return {"reason": "SuccessfulRescale", "note": note, "regarding": regarding}


WOKEN = {"rescaled": {"name": "w", "namespace": "t", "metrics": ["router_queue_depth"]}}


def make(
    pods: list[dict[str, Any]] = (),
    nodes: list[dict[str, Any]] = (),
    events: list[dict[str, Any]] = (),
    series: dict[str, list[dict[str, str]]] | None = None,
    hpas: list[dict[str, Any]] = (),
    alive: Any = lambda: None,
    kubectl: Any = None,
) -> Checks:
    view = ClusterView(kube=None)  # type: ignore[arg-type]
    view.pods.store = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    view.nodes.store = {n["metadata"]["name"]: n for n in nodes}
    view.hpas = list(hpas)
    timeline = Timeline(stream=io.StringIO())
    return Checks(
        view,
        FakeKube(list(events)),
        FakeProm(series or {}),
        FLEET,
        alive,
        timeline,
        interval=0.01,
        kubectl=kubectl,
    )  # type: ignore[arg-type]


def expect(doc: dict[str, Any]) -> sc.Expect:
    return sc.Expect.model_validate(doc)


def zero_hpa(
    desired: int = 0,
    current: int = 0,
    scaled: str | None = "True",
    active: str = "True",
    min_replicas: int = 0,
    last_scale: bool = True,
) -> dict[str, Any]:
    """An HPA `w` on the gateway's External metric, as kube-controller-manager writes its status (1.37:
    the ScaledToZero condition; currentReplicas omitted when 0)."""
    conditions = [{"type": "ScalingActive", "status": active, "reason": "ValidMetricFound"}]
    if scaled is not None:
        message = "the HPA controller scaled the workload to zero"
        conditions.append({"type": "ScaledToZero", "status": scaled, "message": message})
    metric = {"name": "gateway_requests_per_second", "selector": {"matchLabels": {"service": "w"}}}
    status: dict[str, Any] = {"desiredReplicas": desired, "conditions": conditions}
    if current:
        status["currentReplicas"] = current
    if last_scale:
        status["lastScaleTime"] = "2026-12-03T15:00:00Z"
    return {
        "metadata": {"name": "w", "namespace": "t"},
        "spec": {
            "minReplicas": min_replicas,
            "maxReplicas": 4,
            "metrics": [
                {"type": "External", "external": {"metric": metric, "target": {"averageValue": "20"}}}
            ],
        },
        "status": status,
    }


PARKED = {"parked_at_zero": {"name": "w", "namespace": "t"}}


CASES = [
    pytest.param(
        make(
            pods=[
                pod("w-1", node="n0", gpus="0,1,2,3", numa="0"),
                pod("w-2", node="n1", gpus="4,5,6,7", numa="1"),
            ]
        ),
        {"numa_aligned": {"workload": "w", "namespace": "t", "pods": 2, "gpus": 4}},
        True,
        "w-1 on n0 GPUs 0,1,2,3 NUMA 0",
        id="numa-aligned",
    ),
    pytest.param(
        make(pods=[pod("w-1", node="n0", gpus="2,3,4,5", numa="0,1")]),
        {"numa_aligned": {"workload": "w", "namespace": "t", "pods": 1, "gpus": 4}},
        False,
        "NUMA 0,1",
        id="numa-split",
    ),
    pytest.param(
        make(nodes=[node("n0", "xid-79", "False", True)], events=[event("GPUQuarantined", "n0", "default")]),
        {"quarantined": {"node": "n0", "reason": "xid-79"}},
        True,
        "xid-79:NoSchedule",
        id="quarantined",
    ),
    pytest.param(
        make(nodes=[node("n0", "xid-79", "False", True)]),
        {"quarantined": {"node": "n0"}},
        False,
        "no GPUQuarantined Event",
        id="quarantined-without-event",
    ),
    pytest.param(
        make(nodes=[node("n0", "xid-48", "False", True)]),
        {"quarantined": {"node": "n0", "reason": "xid-79"}},
        False,
        "xid-48",
        id="quarantined-for-another-reason",
    ),
    pytest.param(
        make(
            nodes=[node("n0", "fabric-manager", "False", True)],
            events=[
                event(
                    "GPUQuarantined",
                    "n0",
                    "default",
                    "Fabric Manager status failure (3 consecutive passes); GPUs GPU-a",
                )
            ],
        ),
        {"quarantined": {"node": "n0", "reason": "fabric-manager", "debounce": 3}},
        True,
        "Fabric Manager status failure (3 consecutive passes)",
        id="quarantined-after-the-debounce",
    ),
    pytest.param(
        make(
            nodes=[node("n0", "fabric-manager", "False", True)],
            events=[
                event(
                    "GPUQuarantined", "n0", "default", "Fabric Manager status failure (1 consecutive passes)"
                )
            ],
        ),
        {"quarantined": {"node": "n0", "reason": "fabric-manager", "debounce": 3}},
        False,
        "(1 consecutive passes)",
        id="quarantined-without-the-debounce",
    ),
    pytest.param(
        make(series={"gpuwarden_health_signals": [{"action": "quarantine"}, {"action": "quarantine"}]}),
        {"signal_state": {"signal": "nvlink_errors", "state": "boot-grace", "min": 2}},
        True,
        "nvlink_errors holds on 2 GPU(s)/node(s) in state boot-grace (action quarantine)",
        id="signal-in-boot-grace",
    ),
    pytest.param(
        make(),
        {"signal_state": {"signal": "nvlink_errors", "state": "boot-grace"}},
        False,
        "holds on 0 GPU(s)",
        id="signal-not-seen",
    ),
    pytest.param(
        make(
            nodes=[failed_gpu_node("n0", 2)],
            pods=[pod("w-b", node="n0", gpus="1"), pod("w-c", node="n1", gpus="2")],
            events=[event("GPUPodEvicted", "w-a", note="evict: holds a faulty GPU (mode immediate)")],
        ),
        {"drained": {"node": "n0", "namespace": "t", "workload": "w"}},
        True,
        "failed GPU 2: GPUPodEvicted ['w-a']; still on the failed GPU: none; kept on n0: 1 pod(s)",
        id="drained-gpu-precise",
    ),
    pytest.param(
        make(nodes=[failed_gpu_node("n0", 2)], pods=[pod("w-a", node="n0", gpus="2")]),
        {"drained": {"node": "n0", "namespace": "t", "workload": "w"}},
        False,
        "still on the failed GPU: ['w-a']",
        id="pod-left-on-the-failed-gpu",
    ),
    pytest.param(
        make(
            nodes=[failed_gpu_node("n0", 2)],
            events=[event("GPUPodEvicted", "w-a", note="evict: node fault (mode immediate)")],
        ),
        {"drained": {"node": "n0", "namespace": "t", "workload": "w"}},
        False,
        "(evict: node fault",
        id="drained-node-wide",
    ),
    pytest.param(
        make(events=[event("GPUPreempting", "ft-worker-0", note="evicting t/a to free GPUs 0,1,2 on n0")]),
        {"gpu_preempting": {"namespace": "t", "workload": "ft"}},
        True,
        "ft-worker-0: evicting t/a",
        id="gpu-preempting",
    ),
    pytest.param(
        make(
            pods=[pod("w-1", node="n0"), pod("w-2", node="n1")],
            series={
                "container_memory_working_set_bytes": [
                    {"pod": "w-1", "__value__": str(3 * 2**30)},
                    {"pod": "w-2", "__value__": str(3 * 2**30)},
                ]
            },
            kubectl=kubectl_printing("w-1   551m   3072Mi\nw-2   548m   3072Mi\n"),
        ),
        {"top_pods": {"workload": "w", "namespace": "t"}},
        True,
        "2 rows for 2 running w pods; e.g. w-1 551m 3072Mi; memory equals Prometheus' working set for 2, "
        "CPU > 0 for 2",
        id="kubectl-top",
    ),
    pytest.param(
        make(
            pods=[pod("w-1", node="n0"), pod("w-2", node="n1")],
            series={"container_memory_working_set_bytes": [{"pod": "w-1", "__value__": str(3 * 2**30)}]},
            kubectl=kubectl_printing("w-1   551m   3072Mi\n"),
        ),
        {"top_pods": {"workload": "w", "namespace": "t"}},
        False,
        "1 rows for 2 running w pods",
        id="kubectl-top-misses-a-pod",
    ),
    pytest.param(
        make(
            pods=[pod("w-1", node="n0")],
            series={"container_memory_working_set_bytes": [{"pod": "w-1", "__value__": str(3 * 2**30)}]},
            kubectl=kubectl_printing("w-1   551m   3072Mi\n"),
        ),
        {"top_pods": {"workload": "w", "namespace": "t", "pods": 2}},
        False,
        "1 rows for 1 running w pods",
        id="kubectl-top-fewer-pods-than-asked",
    ),
    pytest.param(
        make(pods=[pod("w-1", node="n0")], kubectl=kubectl_failing),
        {"top_pods": {"workload": "w", "namespace": "t"}},
        False,
        "Metrics API not available",
        id="kubectl-top-fails",
    ),
    pytest.param(
        make(nodes=[node("n0"), node("n1", "xid-13")]),
        {"not_quarantined": {"nodes": ["n0", "n1"]}},
        False,
        "['n1']",
        id="storm-node-tainted",
    ),
    pytest.param(
        make(nodes=[node("n0", healthy="True")], events=[event("GPUQuarantineReleased", "n0", "default")]),
        {"released": {"node": "n0"}},
        True,
        "GPUHealthy=True",
        id="released",
    ),
    pytest.param(
        make(nodes=[node("n0")]),
        {"released": {"node": "n0"}},
        False,
        "GPUHealthy=?",
        id="never-quarantined-is-not-released",
    ),
    pytest.param(
        make(
            pods=[pod("urgent-worker-0", app="urgent", node="n0")],
            events=[event("Preempted", "high-1"), event("Preempted", "mid-1")],
        ),
        {"preempted": {"namespace": "t", "victims": 1, "preemptor": "urgent"}},
        False,
        "2 victim(s)",
        id="cascade",
    ),
    pytest.param(
        make(pods=[pod("urgent-worker-0", app="urgent", node="n0")], events=[event("Preempted", "high-1")]),
        {"preempted": {"namespace": "t", "victims": 1, "preemptor": "urgent"}},
        True,
        "['high-1']",
        id="one-victim",
    ),
    pytest.param(
        make(events=[event("PreemptionThrottled", "high-abc-1", note="chain depth 2 > 1")]),
        {"throttled": {"namespace": "t", "workload": "high"}},
        True,
        "chain depth",
        id="throttled",
    ),
    pytest.param(
        make(events=[event("PreemptionThrottled", "highest-1")]),
        {"throttled": {"namespace": "t", "workload": "high"}},
        False,
        "no PreemptionThrottled",
        id="throttled-other-workload",
    ),
    pytest.param(
        make(pods=[pod("eval-worker-0", app="eval", nominated="n2")]),
        {"nominated": {"workload": "eval", "namespace": "t", "node": "n2"}},
        True,
        "n2",
        id="nominated",
    ),
    pytest.param(
        make(pods=[pod("eval-worker-0", app="eval")], events=[event("NominationCleared", "eval-worker-0")]),
        {"nomination_cleared": {"workload": "eval", "namespace": "t"}},
        True,
        "eval-worker-0",
        id="nomination-cleared",
    ),
    pytest.param(
        make(
            pods=[pod("eval-worker-0", app="eval", nominated="n2")],
            events=[event("NominationCleared", "eval-worker-0")],
        ),
        {"nomination_cleared": {"workload": "eval", "namespace": "t"}},
        False,
        "still n2",
        id="nomination-back",
    ),
    pytest.param(
        make(pods=[pod("w-1", node="n0"), pod("w-2", node="n0", deleting=True)]),
        {"running": {"workload": "w", "namespace": "t", "count": 1}},
        True,
        "['w-1']",
        id="terminating-is-not-running",
    ),
    pytest.param(
        make(
            pods=[pod("w-1", node="n0", gpus="0"), pod("w-2", node="n1", gpus="0")],
            series={
                "DCGM_FI_DEV_GPU_UTIL": [{"pod": "w-1"}, {"pod": "w-2"}],
                "http_requests_total": [{"pod": "w-1"}],
            },
        ),
        {"series_follow_pods": {"workload": "w", "namespace": "t"}},
        False,
        "DCGM_FI_DEV_GPU_UTIL for 2 and http_requests_total for 1",
        id="series-missing",
    ),
    pytest.param(
        make(series={"DCGM_FI_DEV_XID_ERRORS": [{"Hostname": "n0"}, {"Hostname": "n1"}]}),
        {"xid_seen": {"code": 13, "nodes": ["n0", "n1"]}},
        True,
        "2/2",
        id="xid-seen",
    ),
    pytest.param(
        make(hpas=[zero_hpa()]),
        PARKED,
        True,
        "minReplicas 0, ScaledToZero=True (the HPA controller scaled the workload to zero), desired 0, "
        "current 0, 0 pods; ScalingActive=True (ValidMetricFound); gateway_requests_per_second none/20",
        id="parked",
    ),
    pytest.param(
        make(hpas=[zero_hpa(scaled=None, last_scale=False)]),
        PARKED,
        False,
        "no ScaledToZero condition (before 1.37); lastScaleTime none",
        id="never-rescaled",  # e.g. the HPA has not synced yet: nothing says the HPA took it to zero
    ),
    pytest.param(
        make(hpas=[zero_hpa(scaled=None)]), PARKED, True, "lastScaleTime 2026", id="parked-before-1.37"
    ),
    pytest.param(
        make(hpas=[zero_hpa(scaled="False")]), PARKED, False, "ScaledToZero=False", id="woken-since"
    ),
    pytest.param(
        make(hpas=[zero_hpa(desired=0, current=2)], pods=[pod("w-1", node="n0"), pod("w-2", node="n1")]),
        PARKED,
        False,
        "desired 0, current 2, 2 pods: w-1, w-2",
        id="scaling-down",
    ),
    pytest.param(
        make(hpas=[zero_hpa()], pods=[pod("w-1", node="n0", deleting=True)]),
        PARKED,
        False,
        "1 pods: w-1",
        id="last-pod-still-terminating",
    ),
    pytest.param(
        make(hpas=[zero_hpa(active="False")]), PARKED, False, "ScalingActive=False", id="metric-lost-at-zero"
    ),
    pytest.param(make(hpas=[zero_hpa(min_replicas=1)]), PARKED, False, "minReplicas 1", id="min-one"),
    pytest.param(make(), PARKED, False, "no HPA t/w", id="no-hpa"),
    pytest.param(
        make(
            events=[
                hpa_event(
                    "New size: 2; reason: external metric router_queue_depth(&LabelSelector{}) above target"
                )
            ]
        ),
        WOKEN,
        True,
        "router_queue_depth above target",
        id="woken-by-the-router",
    ),
    pytest.param(
        make(
            events=[
                hpa_event("New size: 4; reason: external metric vllm_workload_queue_depth(nil) above target")
            ]
        ),
        WOKEN,
        False,
        "vllm_workload_queue_depth above target",
        id="rescaled-on-another-metric",
    ),
    pytest.param(
        make(events=[hpa_event("New size: 0; reason: All metrics below target")]),
        WOKEN,
        False,
        "New size: 0; reason: All metrics below target",
        id="scaled-down-only",
    ),
    pytest.param(
        make(
            events=[
                hpa_event("New size: 2; reason: external metric router_queue_depth(nil) above target", "x")
            ]
        ),
        WOKEN,
        False,
        "none",
        id="another-hpa",
    ),
]


@pytest.mark.parametrize(("checks", "doc", "passed", "seen"), CASES)
async def test_probe(checks: Checks, doc: dict[str, Any], passed: bool, seen: str) -> None:
    outcome = await checks.check(expect({**doc, "within": 0.05}), 0.05)
    assert outcome.passed is passed, outcome.detail
    assert seen in outcome.detail


async def test_hold_fails_when_the_outcome_stops_holding() -> None:
    checks = make(nodes=[node("n0")])
    e = expect({"not_quarantined": {"nodes": ["n0"]}, "hold": 0.3})

    async def later() -> None:
        await asyncio.sleep(0.1)
        checks.view.nodes.store["n0"] = node("n0", "xid-13")

    outcome, _ = await asyncio.gather(checks.check(e, 1.0), later())
    assert not outcome.passed and outcome.detail.startswith("held 0s, then:")


async def test_a_dead_child_process_fails_the_outcome_at_once() -> None:
    def dead() -> None:
        raise ProcessFailed("gpuwarden controller exited with status 1; last lines:\n...")

    checks = make(nodes=[node("n0")], alive=dead)
    outcome = await checks.check(expect({"not_quarantined": {"nodes": ["n0"]}, "hold": 5}), 10)
    assert not outcome.passed and outcome.detail == "gpuwarden controller exited with status 1; last lines:"
    assert outcome.took < 1
