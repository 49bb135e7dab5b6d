"""Action scale-down: which pods are due, the owner read, the choice per owner (HPA floor, budget, kinds)
and the writes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.idle.act import ActResult, IdleActuator
from controller.idle.decide import IdleVerdict, Judgement
from controller.idle.metrics import IdleMetrics
from controller.idle.observe import observe_targets
from controller.idle.scale import ScaleDown, ScaleHeld, ScalePlan, ScaleTarget, due, plan_scale_downs
from controller.idle.snapshot import IdlePod, Owner, parse_time
from gpuwarden.config.idle import IdleConfig
from gpuwarden.errors import KubeConflict, KubeNotFound
from gpuwarden.kube import DEPLOYMENTS, HPAS, PODS, REPLICASETS, STATEFULSETS, ObjectList, Resource
from gpuwarden.wellknown import POD_DELETION_COST

NOW = parse_time("2026-12-02T12:00:00Z") or 0.0
OLD = "2026-12-02T10:00:00Z"  # idle-since two hours before NOW
RECENT = "2026-12-02T11:50:00Z"  # ten minutes before NOW
CFG = IdleConfig(enabled=True, rules=[{"name": "serving", "namespaces": ["inf"], "action": "scale-down"}])
RS = Owner("apps/v1", "ReplicaSet", "web-5d9", "uid-rs")


def pod(name: str = "web-5d9-a", *, owner: Owner | None = RS, since: str | None = OLD) -> IdlePod:
    return IdlePod("inf", name, f"uid-{name}", "n1", 1, ("0",), NOW - 7200, {}, owner, since)


def judged(p: IdlePod, verdict: IdleVerdict = IdleVerdict.IDLE, **kw: Any) -> Judgement:
    return Judgement(p, verdict, "why", "serving", action=kw.pop("action", "scale-down"), **kw)


@pytest.mark.parametrize(
    ("judgement", "is_due"),
    [
        pytest.param(judged(pod()), True, id="idle-reported-long-enough"),
        pytest.param(judged(pod(since=RECENT)), False, id="reported-too-recently"),
        pytest.param(judged(pod(since=None)), False, id="not-reported-yet"),
        pytest.param(judged(pod(), acknowledged=True), False, id="acknowledged"),
        pytest.param(judged(pod(), IdleVerdict.UNKNOWN), False, id="unknown-is-never-due"),
        pytest.param(judged(pod(), action="report"), False, id="report-rule"),
    ],
)
def test_due(judgement: Judgement, is_due: bool) -> None:
    assert due([judgement], CFG, NOW) == ([judgement.pod] if is_due else [])


DEP = ScaleTarget("inf", "Deployment", "web", replicas=3, resource_version="7")


@pytest.mark.parametrize(
    ("targets", "config", "budget", "want"),
    [
        pytest.param({"a": DEP}, CFG, 5, ["Deployment/web 3->2"], id="one-less"),
        pytest.param(
            {"a": DEP},
            CFG.model_copy(update={"scale_down_to": "zero"}),
            5,
            ["Deployment/web 3->0"],
            id="to-zero",
        ),
        pytest.param(
            {"a": DEP, "b": DEP}, CFG, 5, ["Deployment/web 3->2"], id="two-idle-pods-one-action-per-pass"
        ),
        pytest.param(
            {"a": replace(DEP, hpa="web", hpa_min=3)},
            CFG,
            5,
            ["held: HorizontalPodAutoscaler web keeps minReplicas 3 (the Deployment has 3)"],
            id="hpa-floor-holds",
        ),
        pytest.param(
            {"a": replace(DEP, hpa="web", hpa_min=2)},
            CFG.model_copy(update={"scale_down_to": "zero"}),
            5,
            ["Deployment/web 3->2"],
            id="hpa-floor-clamps-zero",
        ),
        pytest.param(
            {"a": replace(DEP, hpa="web", hpa_min=0)},
            CFG.model_copy(update={"scale_down_to": "zero"}),
            5,
            ["Deployment/web 3->0"],
            id="hpa-scale-to-zero-allows-zero",
        ),
        pytest.param({}, CFG, 5, ["held: no owner to scale (a bare pod)"], id="bare-pod"),
        pytest.param(
            {"a": ScaleTarget("inf", "Job", "train")},
            CFG,
            5,
            ["held: owner Job train is not scaled by gpuwarden (Deployment, StatefulSet, ReplicaSet)"],
            id="job-is-not-scaled",
        ),
        pytest.param(
            {"a": replace(DEP, replicas=0)},
            CFG,
            5,
            ["held: Deployment web is at 0 replicas already"],
            id="already-zero",
        ),
        pytest.param(
            {"a": ScaleTarget("inf", "Deployment", "web", problem="Deployment web not found")},
            CFG,
            5,
            ["held: Deployment web not found"],
            id="unreadable-owner",
        ),
        pytest.param({"a": DEP}, CFG, 0, ["held: budget: 5 scale-downs per hour"], id="budget-spent"),
    ],
)
def test_plan_scale_downs(
    targets: dict[str, ScaleTarget], config: IdleConfig, budget: int, want: list[str]
) -> None:
    pods = [pod("web-5d9-a"), pod("web-5d9-b")][: max(1, len(targets))]
    keyed = {p.key: targets[k] for p, k in zip(pods, sorted(targets), strict=False)}
    downs, held = plan_scale_downs(pods, keyed, config, budget)
    got = [f"{d.target.kind}/{d.target.name} {d.target.replicas}->{d.replicas}" for d in downs]
    got += [f"held: {h.reason}" for h in held]
    assert got == want


class Api:
    """The reads and writes scale-down makes, over a few in-memory objects."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]], conflict: bool = False) -> None:
        self.objects, self.conflict = objects, conflict
        self.patches: list[tuple[str, str, Any, str | None]] = []

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None,
                  subresource: str | None = None) -> dict[str, Any]:  # fmt: skip
        key = (resource.plural + (f"/{subresource}" if subresource else ""), name)
        if key not in self.objects:
            raise KubeNotFound(f"{key} not found", status=404)
        return self.objects[key]

    async def list_objects(self, resource: Resource, *, namespace: str | None = None) -> ObjectList:
        assert resource is HPAS
        return ObjectList(
            [o for (kind, _), o in self.objects.items() if kind == "horizontalpodautoscalers"], "1"
        )

    async def patch(self, resource: Resource, name: str, body: Any, *, namespace: str | None = None,
                    subresource: str | None = None, **_: Any) -> dict[str, Any]:  # fmt: skip
        if self.conflict and subresource == "scale":
            raise KubeConflict("the object has been modified", status=409)
        self.patches.append((resource.plural, name, body, subresource))
        return {}


def _rs(deployment: str | None) -> dict[str, Any]:
    refs = [{"kind": "Deployment", "name": deployment, "controller": True}] if deployment else []
    return {"metadata": {"name": "web-5d9", "ownerReferences": refs}}


def _scale(replicas: int) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "42"}, "spec": {"replicas": replicas}}


def _hpa(target: str, minimum: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}}
    if minimum is not None:
        spec["minReplicas"] = minimum
    return {"metadata": {"name": "web-hpa"}, "spec": spec}


@pytest.mark.parametrize(
    ("objects", "owner", "want"),
    [
        pytest.param(
            {("replicasets", "web-5d9"): _rs("web"), ("deployments/scale", "web"): _scale(3)},
            RS,
            ScaleTarget("inf", "Deployment", "web", 3, "42"),
            id="replicaset-resolves-to-its-deployment",
        ),
        pytest.param(
            {("replicasets", "web-5d9"): _rs(None), ("replicasets/scale", "web-5d9"): _scale(2)},
            RS,
            ScaleTarget("inf", "ReplicaSet", "web-5d9", 2, "42"),
            id="bare-replicaset",
        ),
        pytest.param(
            {("statefulsets/scale", "db"): _scale(1)},
            Owner("apps/v1", "StatefulSet", "db", "u"),
            ScaleTarget("inf", "StatefulSet", "db", 1, "42"),
            id="statefulset",
        ),
        pytest.param(
            {
                ("replicasets", "web-5d9"): _rs("web"),
                ("deployments/scale", "web"): _scale(3),
                ("horizontalpodautoscalers", "web-hpa"): _hpa("web", None),
            },
            RS,
            ScaleTarget("inf", "Deployment", "web", 3, "42", "web-hpa", 1),
            id="hpa-default-min-is-1",
        ),
        pytest.param(
            {
                ("replicasets", "web-5d9"): _rs("web"),
                ("deployments/scale", "web"): _scale(3),
                ("horizontalpodautoscalers", "web-hpa"): _hpa("other", 4),
            },
            RS,
            ScaleTarget("inf", "Deployment", "web", 3, "42"),
            id="hpa-of-another-target-ignored",
        ),
        pytest.param(
            {("replicasets", "web-5d9"): _rs("web")},
            RS,
            ScaleTarget("inf", "Deployment", "web", problem="Deployment web not found"),
            id="deployment-gone",
        ),
        pytest.param(
            {},
            RS,
            ScaleTarget(
                "inf",
                "ReplicaSet",
                "web-5d9",
                problem="owner not readable: ('replicasets', 'web-5d9') not found",
            ),
            id="replicaset-gone",
        ),
        pytest.param(
            {},
            Owner("batch/v1", "Job", "train", "u"),
            ScaleTarget("inf", "Job", "train"),
            id="job-read-as-is",
        ),
        pytest.param({}, None, None, id="bare-pod-no-target"),
    ],
)
def test_observe_targets(
    objects: dict[tuple[str, str], Any], owner: Owner | None, want: ScaleTarget | None
) -> None:
    p = pod(owner=owner)
    got = asyncio.run(observe_targets(Api(objects), [p]))  # type: ignore[arg-type]
    assert got.get(p.key) == want


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    async def emit(self, regarding: Any, *, reason: str, note: str, **_: Any) -> None:
        self.events.append((regarding.kind, regarding.name, reason, note))


def act(plan: ScalePlan, api: Api, dry_run: bool = False) -> tuple[Recorder, ActResult]:
    recorder, result = Recorder(), ActResult()
    actuator = IdleActuator(api, recorder, IdleMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    asyncio.run(actuator.apply_scale(plan, dry_run, result))
    return recorder, result


def test_deployment_scaled_by_one_idle_pod_removed_first_with_the_scale_precondition() -> None:
    api = Api({})
    down = ScaleDown(replace(DEP, resource_version="42"), 2, (pod(),), "Deployment web scaled 3 -> 2")
    recorder, result = act(ScalePlan(downs=(down,)), api)
    cheapest = {"metadata": {"uid": "uid-web-5d9-a", "annotations": {POD_DELETION_COST: "-1000"}}}
    assert api.patches == [
        (PODS.plural, "web-5d9-a", cheapest, None),
        (
            DEPLOYMENTS.plural,
            "web",
            {"metadata": {"resourceVersion": "42"}, "spec": {"replicas": 2}},
            "scale",
        ),
    ]
    assert result.scaled == ["inf/Deployment/web"]
    assert [(k, r) for k, _, r, _ in recorder.events] == [
        ("Deployment", "GPUIdleScaledDown"),
        ("Pod", "GPUIdleScaledDown"),
    ]


def test_statefulset_and_zero_need_no_deletion_cost() -> None:
    api = Api({})
    sts = ScaleTarget("inf", "StatefulSet", "db", 2, "9")
    act(
        ScalePlan(
            downs=(ScaleDown(sts, 1, (pod(),), "m"), ScaleDown(replace(DEP, name="b"), 0, (pod(),), "m"))
        ),
        api,
    )
    assert [(r, n, s) for r, n, _, s in api.patches] == [
        (STATEFULSETS.plural, "db", "scale"),
        (DEPLOYMENTS.plural, "b", "scale"),
    ]


def test_changed_owner_is_not_scaled_dry_run_writes_nothing_held_is_evented() -> None:
    _, result = act(ScalePlan(downs=(ScaleDown(DEP, 2, (pod(),), "m"),)), Api({}, conflict=True))
    assert result.scaled == [] and result.failures == 0
    api = Api({})
    recorder, result = act(ScalePlan(downs=(ScaleDown(DEP, 2, (pod(),), "m"),)), api, dry_run=True)
    assert api.patches == [] and result.scaled == ["inf/Deployment/web"]
    assert all(note.startswith("[dry-run] ") for *_, note in recorder.events)
    recorder, _ = act(
        ScalePlan(held=(ScaleHeld(DEP, (pod(),), "HorizontalPodAutoscaler web keeps 3"),)), Api({})
    )
    assert recorder.events == [("Deployment", "web", "GPUIdleScaleDownHeld",
                                "idle scale-down held: HorizontalPodAutoscaler web keeps 3")]  # fmt: skip


def test_replicasets_resource_is_the_apps_group() -> None:
    versions = (REPLICASETS.api_version, STATEFULSETS.api_version, HPAS.api_version)
    assert versions == ("apps/v1", "apps/v1", "autoscaling/v2")


def _event(
    kind: str, name: str, at: str, *, series: str | None = None, message: str = "evicted"
) -> dict[str, Any]:
    involved = {"kind": kind, "name": name, "namespace": "inf", "uid": f"u-{name}"}
    event: dict[str, Any] = {"involvedObject": involved, "eventTime": at, "message": message}
    if series:
        event["series"] = {"lastObservedTime": series}
    return event


@pytest.mark.parametrize(
    ("events", "on_pods", "want"),
    [
        pytest.param(
            [_event("Pod", "a", RECENT), _event("Pod", "b", RECENT)], True, 2, id="two-pods-this-hour"
        ),
        pytest.param([_event("Pod", "a", OLD)], True, 0, id="older-than-the-hour"),
        pytest.param([_event("Pod", "a", OLD, series=RECENT)], True, 1, id="series-seen-again-this-hour"),
        pytest.param(
            [_event("Pod", "a", RECENT), _event("ReplicaSet", "rs", RECENT)],
            True,
            1,
            id="owner-events-are-not-pod-actions",
        ),
        pytest.param(
            [_event("Pod", "a", RECENT), _event("Deployment", "web", RECENT)],
            False,
            1,
            id="owners-for-scale-downs",
        ),
        pytest.param(
            [_event("Pod", "a", RECENT, message="[dry-run] evicted")], True, 0, id="dry-run-not-counted"
        ),
        pytest.param([_event("Pod", "a", RECENT), _event("Pod", "a", RECENT)], True, 1, id="one-pod-twice"),
        pytest.param([_event("Pod", "a", "yesterday")], True, 0, id="unreadable-time"),
    ],
)
def test_recent_actions_counts_the_fleets_hour_from_our_events(
    events: list[dict[str, Any]], on_pods: bool, want: int
) -> None:
    from controller.idle.snapshot import recent_actions

    assert recent_actions(events, NOW, 3600, on_pods=on_pods) == want
