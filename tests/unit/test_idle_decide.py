"""Idle detection tables: the query's answer read, the join of pods to GPUs, the verdict and the plan."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from controller.idle.decide import IdlePlan, judge, plan_idle, policy_from_config
from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.query import STAT_LABEL, GpuUsage, idle_query, read_usage
from controller.idle.snapshot import GpuReading, IdlePod, NodeGpus, build_snapshot, holdings, join, parse_time
from gpuwarden.config.idle import IdleConfig, IdleMetricLabels
from gpuwarden.config.root import Config

NOW = parse_time("2026-12-02T12:00:00Z") or 0.0
OLD = "2026-12-02T10:00:00Z"  # two hours before NOW
CFG = IdleConfig(enabled=True)  # 1 %, 30 min, 30 s scrape, 80 % coverage: 48 samples needed
FULL = 60


def pod(name: str = "nb", *, ns: str = "ml", gpus: int = 1, ids: tuple[str, ...] | None = None,
        started: float | None = parse_time(OLD), labels: dict[str, str] | None = None,
        since: str | None = None, ack: str | None = None) -> IdlePod:  # fmt: skip
    p = IdlePod(ns, name, f"uid-{name}", "n1", gpus, ids, started, labels or {}, None, since, ack)
    return replace(p, held=holdings(p, NodeGpus()))  # a set resolved as on a node of whole GPUs


def r(gpu: str, peak: float | None, samples: int = FULL, conflict: str = "") -> GpuReading:
    return GpuReading(gpu, peak, samples, conflict)


# --- the verdict -----------------------------------------------------------------------------------
VERDICTS: list[Any] = [
    ("all-under", pod(), (r("0", 0.4),), CFG, Verdict.IDLE, "under 1%"),
    ("at-threshold-is-busy", pod(), (r("0", 1.0),), CFG, Verdict.BUSY, "peaked at 1%"),
    ("threshold-raised", pod(), (r("0", 4.0),), IdleConfig(threshold_percent=5), Verdict.IDLE, "under 5%"),
    ("multi-gpu-one-busy", pod(gpus=4), (r("0", 0), r("1", 0), r("2", 87), r("3", 0)), CFG, Verdict.BUSY,
     "GPU 2 peaked at 87%"),
    ("multi-gpu-all-idle", pod(gpus=4), tuple(r(str(i), 0) for i in range(4)), CFG, Verdict.IDLE,
     "all 4 GPUs"),
    ("busy-wins-over-missing", pod(gpus=2), (r("0", 50),), CFG, Verdict.BUSY, "peaked at 50%"),
    ("no-data", pod(), (), CFG, Verdict.UNKNOWN, "1 of 1 GPUs have no data"),
    ("one-gpu-of-two-missing", pod(gpus=2), (r("0", 0),), CFG, Verdict.UNKNOWN, "1 of 2 GPUs have no data"),
    ("gappy-window", pod(), (r("0", 0, samples=47),), CFG, Verdict.UNKNOWN, "47 samples, needs 48"),
    ("just-covered", pod(), (r("0", 0, samples=48),), CFG, Verdict.IDLE, "under"),
    ("nan-peak", pod(), (r("0", None),), CFG, Verdict.UNKNOWN, "samples"),
    ("exporter-names-another-pod", pod(ids=("0",)), (r("0", 0, conflict="ml/other"),), CFG, Verdict.UNKNOWN,
     "reported for ml/other"),
    ("warming-up", pod(started=NOW - 300), (r("0", 0),), IdleConfig(window_seconds=120), Verdict.YOUNG,
     "running 300s"),
    ("younger-than-window", pod(started=NOW - 1700), (r("0", 0),), CFG, Verdict.YOUNG, "judged after 1800s"),
    ("window-just-fits", pod(started=NOW - 1800), (r("0", 0),), CFG, Verdict.IDLE, "under"),
    ("start-unknown", pod(started=None), (r("0", 0),), CFG, Verdict.UNKNOWN, "start time unknown"),
    ("namespace-glob-excluded", pod(ns="infra-gpu"), (r("0", 0),), IdleConfig(exclude_namespaces=["infra-*"]),
     Verdict.EXCLUDED, "namespace"),
    ("kube-system-by-default", pod(ns="kube-system"), (r("0", 0),), CFG, Verdict.EXCLUDED, "namespace"),
    ("label-opt-out", pod(labels={"gpuwarden.io/idle-exclude": "true"}), (r("0", 0),), CFG, Verdict.EXCLUDED,
     "label gpuwarden.io/idle-exclude=true"),
    ("label-false-is-no-opt-out", pod(labels={"gpuwarden.io/idle-exclude": "false"}), (r("0", 0),), CFG,
     Verdict.IDLE, "under"),
    ("rule-ignore", pod(ns="research"), (r("0", 0),),
     IdleConfig(rules=[{"name": "r", "namespaces": ["res*"], "action": "ignore"}]), Verdict.EXCLUDED,
     "rule r"),
    ("rule-labels-must-all-match", pod(labels={"a": "1"}), (r("0", 0),),
     IdleConfig(rules=[{"name": "r", "match_labels": {"a": "1", "b": "2"}, "action": "ignore"}]),
     Verdict.IDLE, "under"),
]  # fmt: skip


@pytest.mark.parametrize(("pod_", "readings", "config", "verdict", "why"), [v[1:] for v in VERDICTS],
                         ids=[v[0] for v in VERDICTS])  # fmt: skip
def test_verdict(pod_: IdlePod, readings: tuple[GpuReading, ...], config: IdleConfig, verdict: Verdict,
                 why: str) -> None:  # fmt: skip
    j = judge(pod_, readings, config, NOW)
    assert (j.verdict, why in j.reason) == (verdict, True), j.reason


ACKS = [
    ("future", "2026-12-02T13:00:00Z", True),
    ("past", "2026-12-02T11:00:00Z", False),
    ("unreadable", "tomorrow", False),
    ("no-timezone", "2026-12-02T13:00:00", False),
    ("absent", None, False),
]


@pytest.mark.parametrize(("ack", "held"), [a[1:] for a in ACKS], ids=[a[0] for a in ACKS])
def test_ack_holds_marking(ack: str | None, held: bool) -> None:
    p = pod(ack=ack)
    plan = plan_idle(build(p, (r("0", 0),)), policy_from_config(CFG), NOW)
    assert (plan.judgements[0].acknowledged, len(plan.marks)) == (held, 0 if held else 1)
    assert plan.judgements[0].verdict is Verdict.IDLE
    assert bool(plan.problems) == (ack == "tomorrow" or ack == "2026-12-02T13:00:00")


def build(p: IdlePod, readings: tuple[GpuReading, ...], telemetry: bool = True) -> Any:
    from controller.idle.snapshot import IdleSnapshot

    return IdleSnapshot((p,), {p.key: readings}, telemetry)


# --- the plan --------------------------------------------------------------------------------------
PLANS: list[Any] = [
    ("new-idle-marked", pod(), (r("0", 0),), True, ["mark"]),
    ("already-marked-kept", pod(since=OLD), (r("0", 0),), True, []),
    ("busy-again-unmarked", pod(since=OLD), (r("0", 30),), True, ["unmark"]),
    ("unknown-keeps-mark", pod(since=OLD), (), True, []),
    ("query-failed-keeps-mark", pod(since=OLD), (r("0", 30),), False, []),
    ("query-failed-marks-nothing", pod(), (r("0", 0),), False, []),
    ("excluded-unmarked", pod(since=OLD, labels={"gpuwarden.io/idle-exclude": "true"}), (), True, ["unmark"]),
    ("acked-keeps-mark", pod(since=OLD, ack="2026-12-03T00:00:00Z"), (r("0", 0),), True, []),
    ("busy-unmarked-never-marked", pod(), (r("0", 30),), True, []),
]  # fmt: skip


@pytest.mark.parametrize(("pod_", "readings", "telemetry", "ops"), [p[1:] for p in PLANS],
                         ids=[p[0] for p in PLANS])  # fmt: skip
def test_plan(pod_: IdlePod, readings: tuple[GpuReading, ...], telemetry: bool, ops: list[str]) -> None:
    plan = plan_idle(build(pod_, readings, telemetry), policy_from_config(CFG), NOW)
    assert ["mark"] * len(plan.marks) + ["unmark"] * len(plan.unmarks) == ops
    if plan.marks:
        assert plan.marks[0].since == NOW - 1800


def test_budget_defers_the_rest_and_counts_gpus_by_namespace() -> None:
    from controller.idle.snapshot import IdleSnapshot

    pods = tuple(pod(f"p{i}", ns="a" if i % 2 else "b", gpus=2) for i in range(5))
    snap = IdleSnapshot(pods, {p.key: (r("0", 0), r("1", 0)) for p in pods}, True)
    plan = plan_idle(snap, policy_from_config(IdleConfig(max_marks_per_pass=3)), NOW)
    assert ([m.pod.name for m in plan.marks], plan.deferred) == (["p0", "p1", "p2"], ("a/p3", "b/p4"))
    assert plan.idle_gpus_by_namespace() == {"b": 6, "a": 4}
    assert plan.counts == {"idle": 5}


def test_dry_run_from_config_or_cli_never_lifted() -> None:
    assert policy_from_config(IdleConfig()).dry_run is True
    assert policy_from_config(IdleConfig(dry_run=False)).dry_run is False
    assert policy_from_config(IdleConfig(dry_run=False), dry_run=True).dry_run is True
    assert policy_from_config(IdleConfig(dry_run=True), dry_run=False).dry_run is True


def test_plan_to_dict_lists_idle_pods_and_actions() -> None:
    plan: IdlePlan = plan_idle(build(pod(), (r("0", 0.5),)), policy_from_config(CFG), NOW)
    d: dict[str, Any] = plan.to_dict()
    assert [i["pod"] for i in d["idle"]] == ["ml/nb"]
    assert [m["pod"] for m in d["mark"]] == ["ml/nb"]


# --- the join --------------------------------------------------------------------------------------
def u(
    gpu: str, peak: float | None, *, node: str = "n1", ns: str = "", p: str = "", n: int = FULL
) -> GpuUsage:
    return GpuUsage(node, gpu, ns, p, peak, n)


JOINS: list[Any] = [
    ("recorded-ids-unlabelled-series", pod(ids=("1", "2"), gpus=2), [u("1", 0), u("2", 5), u("3", 90)],
     [r("1", 0), r("2", 5)]),
    ("recorded-ids-other-node-ignored", pod(ids=("1",)), [u("1", 90, node="n2")], []),
    ("recorded-ids-label-came-and-went", pod(ids=("0",)), [u("0", 0), u("0", 3, ns="ml", p="nb", n=20)],
     [r("0", 3)]),
    ("recorded-ids-conflict", pod(ids=("0",)), [u("0", 0, ns="ml", p="other")],
     [r("0", 0, conflict="ml/other")]),
    ("nan-series-merged-unknown", pod(ids=("0",)), [u("0", 0), u("0", None)], [r("0", None)]),
    ("pod-labels-join", pod(gpus=2), [u("4", 0, ns="ml", p="nb"), u("5", 2, ns="ml", p="nb"),
                                       u("6", 80, ns="ml", p="x")], [r("4", 0), r("5", 2)]),
    ("pod-labels-wrong-node-ignored", pod(), [u("0", 0, ns="ml", p="nb", node="n9")], []),
]  # fmt: skip


@pytest.mark.parametrize(("pod_", "usage", "want"), [j[1:] for j in JOINS], ids=[j[0] for j in JOINS])
def test_join(pod_: IdlePod, usage: list[GpuUsage], want: list[GpuReading]) -> None:
    assert list(join([pod_], usage)[pod_.key]) == want


# --- the query and its answer ----------------------------------------------------------------------
def test_query_is_one_grouped_expression_with_fallback() -> None:
    q = idle_query(IdleMetricLabels(pod="exported_pod", namespace="exported_namespace"), 1800)
    # the fallback never reads utilization on a MIG instance's series or on a per-pod vgpu copy
    util = 'DCGM_FI_DEV_GPU_UTIL{GPU_I_ID="", vgpu=""}[1800s]'
    assert q.count("DCGM_FI_PROF_GR_ENGINE_ACTIVE[1800s]") == 2 and q.count(util) == 2
    assert q.count("DCGM_FI_DEV_GPU_UTIL") == 2
    assert "by (exported_namespace, exported_pod, Hostname, gpu, UUID, GPU_I_ID)" in q
    assert "* 100" in q


def test_read_usage_pairs_peak_and_count_drops_unattributable() -> None:
    lab = IdleMetricLabels()
    base = {"Hostname": "n1", "gpu": "0", "namespace": "ml", "pod": "nb"}
    answer = [
        ({**base, STAT_LABEL: "max"}, 0.5),
        ({**base, STAT_LABEL: "samples"}, 59.0),
        ({"gpu": "1", STAT_LABEL: "max"}, 0.0),  # no node: cannot be attributed
        ({**base, "gpu": "2", STAT_LABEL: "max"}, float("nan")),
    ]
    assert read_usage(answer, lab) == (
        GpuUsage("n1", "0", "ml", "nb", 0.5, 59),
        GpuUsage("n1", "2", "ml", "nb", None, 0),
    )


# --- pods and config -------------------------------------------------------------------------------
def pod_json(phase: str = "Running", gpus: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "nb", "namespace": "ml", "uid": "u1", **meta},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase, "startTime": OLD},
    }


PODS: list[Any] = [
    ("running-gpu-pod", pod_json(), True),
    ("pending", pod_json(phase="Pending"), False),
    ("succeeded", pod_json(phase="Succeeded"), False),
    ("no-gpu", pod_json(gpus=0), False),
    ("terminating", pod_json(deletionTimestamp=OLD), False),
]


@pytest.mark.parametrize(("obj", "kept"), [p[1:] for p in PODS], ids=[p[0] for p in PODS])
def test_which_pods_are_judged(obj: dict[str, Any], kept: bool) -> None:
    assert len(build_snapshot([obj], [], resource="nvidia.com/gpu").pods) == int(kept)


def test_pod_owner_and_annotations_read() -> None:
    obj = pod_json(
        ownerReferences=[
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "nb-1", "uid": "o", "controller": True}
        ],
        annotations={"gpuwarden.io/gpu-ids": "3,1", "gpuwarden.io/idle-since": OLD},
    )  # fmt: skip
    p = build_snapshot([obj], [], resource="nvidia.com/gpu").pods[0]
    assert (p.owner and p.owner.kind, p.gpu_ids, p.idle_since_text, p.started) == (
        "ReplicaSet",
        ("1", "3"),
        OLD,
        parse_time(OLD),
    )


CONFIGS: list[Any] = [
    ("unknown-key", {"enabeld": True}, "enabeld"),
    ("bad-action", {"default_action": "evict-now"}, "default_action"),
    ("window-too-short", {"window_seconds": 30}, "window_seconds"),
    ("scrape-vs-window", {"window_seconds": 60, "scrape_interval_seconds": 45}, "at most half"),
    ("duplicate-rules", {"rules": [{"name": "a", "action": "report"}, {"name": "a", "action": "ignore"}]},
     "unique"),
    ("bad-label-name", {"metric_labels": {"pod": "exported-pod"}}, "pod"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "field"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_bad_config_rejected(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Config.model_validate({"idle": raw})


def test_off_and_dry_run_by_default() -> None:
    idle = Config().idle
    assert (idle.enabled, idle.dry_run, idle.default_action) == (False, True, "report")


def test_gpuwarden_plan_table_lists_idle_pods_and_their_action() -> None:
    from controller.app import ControllerPlan

    acked = pod("held", ack="2026-12-03T00:00:00Z", since=OLD)
    from controller.idle.snapshot import IdleSnapshot

    snap = IdleSnapshot((pod(), acked), {"ml/nb": (r("0", 0.5),), "ml/held": (r("0", 0),)}, True)
    idle = plan_idle(snap, policy_from_config(CFG), NOW).to_dict()
    table = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, idle=idle).render_table()
    assert "IDLE GPUS\n  ml/nb (1 GPUs) since now: report; all 1 GPUs under 1%" in table
    assert f"  ml/held (1 GPUs) since {OLD}: held (acknowledged)" in table
    off = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}).render_table()
    assert "IDLE" not in off


# --- action choice: evict ----------------------------------------------------------------------------------
EVICT = IdleConfig(
    rules=[{"name": "notebooks", "namespaces": ["nb-*"], "action": "evict"}],
    evict_after_seconds=3600,
    max_evictions_per_hour=2,
)
HOURS_AGO = "2026-12-02T10:30:00Z"  # idle-since 1.5 h before NOW
RECENT = "2026-12-02T11:40:00Z"  # idle-since 20 min before NOW

ACTIONS: list[Any] = [
    ("evict-rule-due", pod(ns="nb-a", since=HOURS_AGO), (r("0", 0),), 0, "evict"),
    ("evict-rule-not-yet", pod(ns="nb-a", since=RECENT), (r("0", 0),), 0, "none"),
    ("evict-rule-unreported-marked-first", pod(ns="nb-a"), (r("0", 0),), 0, "mark"),
    ("evict-rule-unreadable-since", pod(ns="nb-a", since="yesterday"), (r("0", 0),), 0, "none"),
    ("report-rule-never-evicts", pod(ns="ml", since=HOURS_AGO), (r("0", 0),), 0, "none"),
    ("acknowledged-held", pod(ns="nb-a", since=HOURS_AGO, ack="2026-12-02T13:00:00Z"), (r("0", 0),), 0,
     "none"),
    ("ack-expired", pod(ns="nb-a", since=HOURS_AGO, ack="2026-12-02T11:00:00Z"), (r("0", 0),), 0, "evict"),
    ("busy-unmarked-not-evicted", pod(ns="nb-a", since=HOURS_AGO), (r("0", 40),), 0, "unmark"),
    ("unknown-not-evicted", pod(ns="nb-a", since=HOURS_AGO), (r("0", 0, samples=3),), 0, "none"),
    ("budget-spent", pod(ns="nb-a", since=HOURS_AGO), (r("0", 0),), 2, "over-budget"),
]  # fmt: skip


@pytest.mark.parametrize(("pod_", "readings", "recent", "want"), [a[1:] for a in ACTIONS],
                         ids=[a[0] for a in ACTIONS])  # fmt: skip
def test_action_choice(pod_: IdlePod, readings: tuple[GpuReading, ...], recent: int, want: str) -> None:
    from controller.idle.snapshot import IdleSnapshot

    snap = IdleSnapshot((pod_,), {pod_.key: readings}, True, recent_evictions=recent)
    plan = plan_idle(snap, policy_from_config(EVICT), NOW)
    got = (
        ["evict"] * len(plan.evictions) + ["mark"] * len(plan.marks) + ["unmark"] * len(plan.unmarks)
        + ["over-budget"] * len(plan.over_budget)
    )  # fmt: skip
    assert got == ([] if want == "none" else [want])


def test_budget_counts_this_pass_and_the_last_hour() -> None:
    from controller.idle.snapshot import IdleSnapshot

    pods = tuple(pod(f"p{i}", ns="nb-a", since=HOURS_AGO) for i in range(4))
    snap = IdleSnapshot(pods, {p.key: (r("0", 0),) for p in pods}, True, recent_evictions=1)
    plan = plan_idle(snap, policy_from_config(EVICT), NOW)
    assert ([e.pod.name for e in plan.evictions], plan.over_budget) == (
        ["p0"],
        ("nb-a/p1", "nb-a/p2", "nb-a/p3"),
    )
    assert "idle for 90 min (rule notebooks)" in plan.evictions[0].message


def test_gpuwarden_plan_table_shows_evictions_and_budget() -> None:
    from controller.app import ControllerPlan
    from controller.idle.snapshot import IdleSnapshot

    pods = (pod("a", ns="nb-a", since=HOURS_AGO), pod("b", ns="nb-a", since=HOURS_AGO))
    snap = IdleSnapshot(pods, {p.key: (r("0", 0),) for p in pods}, True, recent_evictions=1)
    idle = plan_idle(snap, policy_from_config(EVICT), NOW).to_dict()
    table = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, idle=idle).render_table()
    assert f"  nb-a/a (1 GPUs) since {HOURS_AGO}: evict;" in table
    assert f"  nb-a/b (1 GPUs) since {HOURS_AGO}: evict held (budget);" in table


# --- power corroboration ----------------------------------------------------------------------------------
POWER = IdleConfig(power_threshold_watts=100)
POWERS: list[Any] = [
    ("idle-draw", GpuReading("0", 0.2, FULL, max_watts=62.0), Verdict.IDLE),
    ("high-draw-is-busy", GpuReading("0", 0.2, FULL, max_watts=250.0), Verdict.BUSY),
    ("no-power-data-unknown", GpuReading("0", 0.2, FULL), Verdict.UNKNOWN),
    ("utilization-busy-wins", GpuReading("0", 40.0, FULL), Verdict.BUSY),
]


@pytest.mark.parametrize(("reading", "verdict"), [p[1:] for p in POWERS], ids=[p[0] for p in POWERS])
def test_power_corroboration(reading: GpuReading, verdict: Verdict) -> None:
    assert judge(pod(), (reading,), POWER, NOW).verdict is verdict
    assert judge(pod(), (reading,), CFG, NOW).verdict is (
        Verdict.BUSY if reading.max_percent == 40 else Verdict.IDLE
    )


def test_power_stat_queried_only_when_on_and_read() -> None:
    lab = IdleMetricLabels()
    assert "DCGM_FI_DEV_POWER_USAGE" not in idle_query(lab, 1800)
    assert "max_over_time(DCGM_FI_DEV_POWER_USAGE[1800s])" in idle_query(lab, 1800, power=True)
    base = {"Hostname": "n1", "gpu": "0"}
    answer = [({**base, STAT_LABEL: "max"}, 0.1), ({**base, STAT_LABEL: "power"}, 70.0)]
    assert read_usage(answer, lab) == (GpuUsage("n1", "0", "", "", 0.1, 0, 70.0),)


# --- prefer-as-victim: the idle-reclaimable mark GPU preemption reads --------------------------------------
PREFER = IdleConfig(
    enabled=True, rules=[{"name": "notebooks", "namespaces": ["nb-*"], "action": "prefer-as-victim"}]
)


def reclaimable(p: IdlePod) -> IdlePod:
    from dataclasses import replace

    return replace(p, reclaimable=True)


RECLAIMS: list[Any] = [
    ("newly-idle-marked-reclaimable", pod(ns="nb-a"), (r("0", 0),), ["mark+reclaimable"]),
    ("newly-idle-report-rule-plain-mark", pod(ns="ml"), (r("0", 0),), ["mark"]),
    ("reported-before-the-rule-existed", pod(ns="nb-a", since=RECENT), (r("0", 0),), ["reclaimable:set"]),
    ("already-reclaimable-nothing-to-do", reclaimable(pod(ns="nb-a", since=RECENT)), (r("0", 0),), []),
    ("acknowledged-loses-the-mark", reclaimable(pod(ns="nb-a", since=RECENT, ack="2026-12-02T13:00:00Z")),
     (r("0", 0),), ["reclaimable:clear"]),
    ("unknown-data-loses-the-mark-keeps-idle-since", reclaimable(pod(ns="nb-a", since=RECENT)),
     (r("0", 0, samples=3),), ["reclaimable:clear"]),
    ("rule-changed-to-report-loses-the-mark", reclaimable(pod(ns="ml", since=RECENT)), (r("0", 0),),
     ["reclaimable:clear"]),
    ("busy-unmarked-both-go", reclaimable(pod(ns="nb-a", since=RECENT)), (r("0", 40),), ["unmark"]),
    ("never-evicted", pod(ns="nb-a", since=HOURS_AGO), (r("0", 0),), ["reclaimable:set"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pod_", "readings", "want"), [c[1:] for c in RECLAIMS], ids=[c[0] for c in RECLAIMS]
)
def test_prefer_as_victim_keeps_the_reclaimable_mark_only_on_idle_reported_pods(
    pod_: IdlePod, readings: tuple[GpuReading, ...], want: list[str]
) -> None:
    from controller.idle.snapshot import IdleSnapshot

    plan = plan_idle(IdleSnapshot((pod_,), {pod_.key: readings}, True), policy_from_config(PREFER), NOW)
    got = (
        ["mark+reclaimable" if m.reclaimable else "mark" for m in plan.marks]
        + [f"reclaimable:{'set' if c.reclaimable else 'clear'}" for c in plan.reclaims]
        + ["unmark"] * len(plan.unmarks) + ["evict"] * len(plan.evictions)
    )  # fmt: skip
    assert got == want


def test_pod_reads_our_reclaimable_mark() -> None:
    from controller.idle.snapshot import idle_pod

    obj = {
        "metadata": {"name": "nb", "namespace": "nb-a", "uid": "u",
                     "annotations": {"gpuwarden.io/idle-reclaimable": "true"}},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": OLD},
    }  # fmt: skip
    got = idle_pod(obj, "nvidia.com/gpu")
    assert got is not None and got.reclaimable
