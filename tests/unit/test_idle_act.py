"""The idle actuator's write paths (UID precondition, failures, dry-run) and the collect-on-scrape metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from controller.idle.act import IdleActuator, format_since
from controller.idle.decide import IdlePlan, Mark, Reclaim, Unmark
from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.metrics import IdleMetrics
from controller.idle.snapshot import IdlePod, Owner
from gpuwarden.errors import KubeError, KubeNotFound
from gpuwarden.wellknown import IDLE_RECLAIMABLE, IDLE_SINCE

NOW = 1_800_000_000.0
OWNER = Owner("apps/v1", "StatefulSet", "nb", "uid-sts")


def idle_pod(name: str = "nb-0", owner: Owner | None = OWNER) -> IdlePod:
    return IdlePod("ml", name, f"uid-{name}", "n1", 1, ("0",), NOW - 7200, {}, owner)


class Api:
    def __init__(self, fail: KubeError | None = None) -> None:
        self.patches: list[tuple[str, Any]] = []
        self.fail = fail

    async def patch(self, _resource: Any, name: str, body: Any, **_: Any) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.patches.append((name, body))
        return {}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    async def emit(self, regarding: Any, *, reason: str, note: str, **_: Any) -> None:
        self.events.append((regarding.kind, regarding.name, reason, note))


def run(plan: IdlePlan, api: Api) -> tuple[Recorder, CollectorRegistry, Any]:
    import asyncio

    registry, recorder = CollectorRegistry(), Recorder()
    act = IdleActuator(api, recorder, IdleMetrics(registry))  # type: ignore[arg-type]
    return recorder, registry, asyncio.run(act.apply(plan))


def mark_plan(dry_run: bool = False, owner: Owner | None = OWNER) -> IdlePlan:
    mark = Mark(idle_pod(owner=owner), NOW - 1800, "default", "GPUs idle: all 1 GPUs under 1%")
    return IdlePlan(NOW, dry_run, True, (), marks=(mark,))


def test_mark_writes_idle_since_with_the_uid_and_events_pod_and_owner() -> None:
    api = Api()
    recorder, registry, result = run(mark_plan(), api)
    since = format_since(NOW - 1800)
    assert api.patches == [("nb-0", {"metadata": {"uid": "uid-nb-0", "annotations": {IDLE_SINCE: since}}})]
    assert [(k, n, r) for k, n, r, _ in recorder.events] == [
        ("Pod", "nb-0", "GPUIdle"),
        ("StatefulSet", "nb", "GPUIdle"),
    ]
    assert result.marked == ["ml/nb-0"]
    assert registry.get_sample_value("gpuwarden_idle_marked_total", {"dry_run": "false"}) == 1


def test_dry_run_writes_nothing_events_say_so() -> None:
    api = Api()
    recorder, registry, _ = run(mark_plan(dry_run=True, owner=None), api)
    assert api.patches == []
    assert [(k, r) for k, _, r, _ in recorder.events] == [("Pod", "GPUIdle")]
    assert recorder.events[0][3].startswith("[dry-run] ")
    assert registry.get_sample_value("gpuwarden_idle_marked_total", {"dry_run": "true"}) == 1


def test_failed_write_emits_nothing_and_is_counted() -> None:
    recorder, registry, result = run(mark_plan(), Api(KubeError("boom", status=500)))
    assert (recorder.events, result.marked, result.failures) == ([], [], 1)
    assert registry.get_sample_value("gpuwarden_idle_write_failures_total") == 1


def test_pod_gone_is_neither_failure_nor_event() -> None:
    recorder, _, result = run(mark_plan(), Api(KubeNotFound("gone", status=404)))
    assert (recorder.events, result.failures) == ([], 0)


def test_unmark_removes_only_our_annotation() -> None:
    api = Api()
    plan = IdlePlan(
        NOW, False, True, (), unmarks=(Unmark(idle_pod(), Verdict.BUSY, "no longer idle (busy)"),)
    )
    recorder, _, result = run(plan, api)
    assert api.patches == [("nb-0", {"metadata": {"uid": "uid-nb-0", "annotations": {IDLE_SINCE: None}}})]
    assert [(k, r) for k, _, r, _ in recorder.events] == [("Pod", "GPUIdleEnded")]
    assert result.unmarked == ["ml/nb-0"]


def test_snapshot_metrics_by_namespace_vanish_when_passes_stop() -> None:
    from controller.idle.decide import Judgement

    clock = [0.0]
    registry = CollectorRegistry()
    metrics = IdleMetrics(registry, stale_after=10, monotonic=lambda: clock[0])
    judged = (Judgement(idle_pod(), Verdict.IDLE, "idle"), Judgement(idle_pod("b"), Verdict.BUSY, "busy"))
    metrics.observe_plan(IdlePlan(NOW, False, True, judged))
    assert registry.get_sample_value("gpuwarden_idle_gpus", {"pod_namespace": "ml"}) == 1
    assert registry.get_sample_value("gpuwarden_idle_pods", {"state": "busy"}) == 1
    clock[0] = 11
    assert registry.get_sample_value("gpuwarden_idle_gpus", {"pod_namespace": "ml"}) is None
    assert registry.get_sample_value("gpuwarden_idle_pods", {"state": "busy"}) is None


class EvictApi(Api):
    def __init__(self, fail: KubeError | None = None) -> None:
        super().__init__(fail)
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.requests.append((method, path, body))
        return {}


def evict_plan(dry_run: bool = False) -> IdlePlan:
    from controller.idle.decide import Evict

    return IdlePlan(NOW, dry_run, True, (), evictions=(Evict(idle_pod(), "nb", "idle for 90 min (rule nb)"),))


def test_evict_goes_through_the_eviction_api_with_the_uid_and_events_pod_and_owner() -> None:
    api = EvictApi()
    recorder, registry, result = run(evict_plan(), api)
    [(method, path, body)] = api.requests
    assert (method, path) == ("POST", "/api/v1/namespaces/ml/pods/nb-0/eviction")
    assert body["deleteOptions"] == {"preconditions": {"uid": "uid-nb-0"}}
    assert [(k, r) for k, _, r, _ in recorder.events] == [
        ("Pod", "GPUIdlePodEvicted"),
        ("StatefulSet", "GPUIdlePodEvicted"),
    ]
    assert result.evicted == ["ml/nb-0"]
    assert registry.get_sample_value("gpuwarden_idle_evictions_total", {"outcome": "evicted"}) == 1


def test_evict_refused_by_a_pdb_is_reported_not_forced() -> None:
    api = EvictApi(KubeError("Cannot evict pod as it would violate the pod's disruption budget.", status=429))
    recorder, registry, result = run(evict_plan(), api)
    assert (result.evicted, result.blocked, result.failures) == ([], ["ml/nb-0"], 0)
    assert [(k, r) for k, _, r, _ in recorder.events] == [("Pod", "GPUIdleEvictionBlocked")]
    assert registry.get_sample_value("gpuwarden_idle_evictions_total", {"outcome": "blocked"}) == 1


def test_evict_dry_run_sends_nothing() -> None:
    api = EvictApi()
    recorder, registry, result = run(evict_plan(dry_run=True), api)
    assert api.requests == [] and result.evicted == ["ml/nb-0"]
    assert all(note.startswith("[dry-run] ") for *_, note in recorder.events) and len(recorder.events) == 2
    assert registry.get_sample_value("gpuwarden_idle_evictions_total", {"outcome": "dry_run"}) == 1


def test_prefer_as_victim_mark_writes_both_annotations_in_one_patch() -> None:
    api = Api()
    mark = Mark(idle_pod(), NOW - 1800, "notebooks", "GPUs idle: all 1 GPUs under 1%", reclaimable=True)
    recorder, _, _ = run(IdlePlan(NOW, False, True, (), marks=(mark,)), api)
    since = format_since(NOW - 1800)
    annotations = {IDLE_SINCE: since, IDLE_RECLAIMABLE: "true"}
    assert api.patches == [("nb-0", {"metadata": {"uid": "uid-nb-0", "annotations": annotations}})]
    assert "GPU preemption may reclaim its GPUs" in recorder.events[0][3]


def test_reclaimable_mark_set_and_cleared_alone_unmark_removes_both() -> None:
    from dataclasses import replace

    pod = replace(idle_pod(), idle_since_text="2026-12-02T10:00:00Z", reclaimable=True)
    api = Api()
    plan = IdlePlan(
        NOW, False, True, (),
        reclaims=(Reclaim(idle_pod("nb-1"), True, "notebooks", "reclaimable"),
                  Reclaim(idle_pod("nb-2"), False, "notebooks", "no longer reclaimable (acknowledged)")),
        unmarks=(Unmark(pod, Verdict.BUSY, "no longer idle (busy)"),),
    )  # fmt: skip
    recorder, _, result = run(plan, api)
    both_gone = {IDLE_SINCE: None, IDLE_RECLAIMABLE: None}
    assert sorted(api.patches, key=lambda p: p[0]) == [
        ("nb-0", {"metadata": {"uid": "uid-nb-0", "annotations": both_gone}}),
        ("nb-1", {"metadata": {"uid": "uid-nb-1", "annotations": {IDLE_RECLAIMABLE: "true"}}}),
        ("nb-2", {"metadata": {"uid": "uid-nb-2", "annotations": {IDLE_RECLAIMABLE: None}}}),
    ]
    assert sorted(result.reclaimable) == ["ml/nb-1", "ml/nb-2"]
    reclaim_events = [(n, r) for _, n, r, _ in recorder.events if r != "GPUIdleEnded"]
    assert reclaim_events == [("nb-1", "GPUIdleReclaimable")]


def test_dry_run_reclaim_writes_nothing() -> None:
    api = Api()
    plan = IdlePlan(NOW, True, True, (), reclaims=(Reclaim(idle_pod(), True, "notebooks", "reclaimable"),))
    recorder, _, _ = run(plan, api)
    assert api.patches == [] and recorder.events[0][3].startswith("[dry-run] ")
