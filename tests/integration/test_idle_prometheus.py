"""Idle detection against a REAL Prometheus: dcgm-exporter-style history backfilled with promtool, the pass's
one grouped query, the join with the pods, the verdicts, and one loop pass writing (or, in dry-run, only
eventing) `gpuwarden.io/idle-since`. The Kubernetes side is an in-memory pod store (the write path's
API shapes are the nominations' and drain's, tested against the real control plane in e2e)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.loop import IdleLoop, plan_from
from controller.idle.observe import observe_usage
from controller.idle.query import POWER_METRIC, PROF_METRIC, UTIL_METRIC
from gpuwarden.config.root import Config
from gpuwarden.wellknown import GPU_IDS, IDLE_ACK_UNTIL, IDLE_SINCE
from harness.localprom import LocalPrometheus, backfill_openmetrics

STEP = 30  # dcgm-exporter scrape interval of the history
MINUTES = 40  # history length; the window is the last 30 minutes
BASE = 'UUID="GPU-{node}-{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",gpu="{gpu}"'

# (metric, node, gpu, namespace, pod, value, minutes of data at the end of the history)
SERIES = [
    (PROF_METRIC, "n1", "0", "ml", "notebook", 0.002, MINUTES),  # idle (0.2 %)
    (PROF_METRIC, "n1", "1", "ml", "trainer", 0.0, MINUTES),  # trainer: one GPU idle ...
    (PROF_METRIC, "n1", "2", "ml", "trainer", 0.6, MINUTES),  # ... one busy: busy
    (PROF_METRIC, "n1", "3", "ml", "gappy", 0.0, 10),  # only 10 minutes of data: unknown
    (UTIL_METRIC, "n1", "0", "ml", "notebook", 40.0, MINUTES),  # ignored: GR_ENGINE_ACTIVE wins per GPU
    (UTIL_METRIC, "n2", "0", "", "", 0.0, MINUTES),  # no PROF, no pod label: joined by gpu-ids
    (UTIL_METRIC, "n2", "1", "ml", "util-busy", 55.0, MINUTES),  # DEV_GPU_UTIL fallback, busy
    (PROF_METRIC, "n2", "2", "ml", "acked", 0.0, MINUTES),  # idle but acknowledged
    (POWER_METRIC, "n1", "0", "ml", "notebook", 61.5, MINUTES),  # power: idle draw
    (POWER_METRIC, "n2", "0", "", "", 240.0, MINUTES),  # power: busy (a memory-bound kernel, say)
]


def history(t_end: int) -> str:
    lines: list[str] = []
    for metric in (PROF_METRIC, UTIL_METRIC, POWER_METRIC):
        lines.append(f"# TYPE {metric} gauge")
        for m, node, gpu, ns, pod, value, minutes in SERIES:
            if m != metric:
                continue
            labels = BASE.format(node=node, gpu=gpu) + (f',namespace="{ns}",pod="{pod}"' if pod else "")
            for t in range(t_end - minutes * 60, t_end + 1, STEP):
                lines.append(f"{metric}{{{labels}}} {value} {t}")
    return "\n".join(lines) + "\n# EOF\n"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str, node: str, gpus: int, *, ids: str | None = None, started: float, **ann: str
) -> dict[str, Any]:
    annotations = {**({GPU_IDS: ids} if ids else {}), **ann}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs",
                                          "uid": f"rs-{name}", "controller": True}]},
        "spec": {"nodeName": node,
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Running", "startTime": rfc3339(started)},
    }  # fmt: skip


def pods(t_end: float) -> list[dict[str, Any]]:
    old = t_end - 3 * 3600
    return [
        pod("notebook", "n1", 1, started=old),
        pod("trainer", "n1", 2, started=old),
        pod("gappy", "n1", 1, started=old),
        pod("old-gpu", "n2", 1, ids="0", started=old),
        pod("util-busy", "n2", 1, started=old),
        pod("acked", "n2", 1, started=old, **{IDLE_ACK_UNTIL: rfc3339(t_end + 3600)}),
        pod("young", "n2", 1, ids="0", started=t_end - 600),  # would share n2/0's data; too young to judge
        pod("no-data", "n3", 1, started=old),
    ]


CONFIG = Config.model_validate({"idle": {"enabled": True, "dry_run": False}})
WANT = {
    "ml/notebook": Verdict.IDLE,
    "ml/trainer": Verdict.BUSY,
    "ml/gappy": Verdict.UNKNOWN,
    "ml/old-gpu": Verdict.IDLE,
    "ml/util-busy": Verdict.BUSY,
    "ml/acked": Verdict.IDLE,
    "ml/young": Verdict.YOUNG,
    "ml/no-data": Verdict.UNKNOWN,
}


class Backfilled:
    def __init__(self, prom: LocalPrometheus, t_end: int) -> None:
        self.prom, self.t_end = prom, t_end


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backfilled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Backfilled]:
    workdir = tmp_path_factory.mktemp("prometheus-idle")
    t_end = (int(time.time()) // 3600 - 3) * 3600
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield Backfilled(prom, t_end)


@pytest.mark.asyncio(loop_scope="module")
async def test_one_query_judges_every_pod(backfilled: Backfilled) -> None:
    registry = CollectorRegistry()
    async with backfilled.prom.client(registry) as prom:
        usage = await observe_usage(prom, CONFIG.idle, backfilled.t_end)
    assert usage is not None
    queries = registry.get_sample_value(
        "gpuwarden_prometheus_requests_total", {"endpoint": "query", "outcome": "success"}
    )
    plan = plan_from(CONFIG, pods(backfilled.t_end), usage, now=backfilled.t_end)
    got = {j.pod.key: j.verdict for j in plan.judgements}
    assert got == WANT, {j.pod.key: j.reason for j in plan.judgements}
    assert queries == 1.0, "one request per pass, whatever the number of pods"
    notebook = next(j for j in plan.judgements if j.pod.key == "ml/notebook")
    assert "peak 0.2%" in notebook.reason, "GR_ENGINE_ACTIVE (a ratio) is preferred and scaled to percent"
    assert sorted(m.pod.key for m in plan.marks) == ["ml/notebook", "ml/old-gpu"], "acked is held"
    assert plan.idle_gpus_by_namespace() == {"ml": 3}


@pytest.mark.asyncio(loop_scope="module")
async def test_window_moved_past_the_data_is_unknown_not_idle(backfilled: Backfilled) -> None:
    later = backfilled.t_end + 3600  # no samples in the window at all
    async with backfilled.prom.client() as prom:
        usage = await observe_usage(prom, CONFIG.idle, later)
    plan = plan_from(CONFIG, pods(backfilled.t_end), usage, now=later)
    assert {j.verdict for j in plan.judgements} == {Verdict.UNKNOWN}
    assert plan.marks == ()


class PodStore:
    """An in-memory pod store with the one write the idle loop makes (a merge patch of annotations)."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.pods = {o["metadata"]["name"]: o for o in objs}
        self.patches: list[tuple[str, Any]] = []
        self.evictions: list[str] = []
        self.synced = asyncio.Event()
        self.synced.set()

    def objects(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods.values()]

    async def patch(self, _resource: Any, name: str, body: Any, **_: Any) -> dict[str, Any]:
        self.patches.append((name, body))
        meta = self.pods[name]["metadata"]
        assert body["metadata"]["uid"] == meta["uid"], "every write carries the pod's UID"
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                meta["annotations"].pop(key, None)
            else:
                meta["annotations"][key] = value
        return copy.deepcopy(self.pods[name])

    async def list_objects(self, resource: Any, *, field_selector: str | None = None, **_: Any) -> Any:
        """Our Events (the fleet's budget count): none written before this test."""
        from gpuwarden.kube import CORE_EVENTS, ObjectList

        assert resource is CORE_EVENTS and field_selector is not None and "reason=" in field_selector
        return ObjectList([], "1")

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        assert (method, path.rsplit("/", 1)[-1]) == ("POST", "eviction")
        name = body["metadata"]["name"]
        assert body["deleteOptions"]["preconditions"]["uid"] == self.pods[name]["metadata"]["uid"]
        self.evictions.append(name)
        return {}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def emit(self, regarding: Any, *, reason: str, note: str, **_: Any) -> None:
        self.events.append((regarding.kind, regarding.name, reason))


async def one_pass(
    backfilled: Backfilled, config: Config, store: PodStore, recorder: Recorder, registry: CollectorRegistry
) -> IdleLoop:
    async with backfilled.prom.client() as prom:
        loop = IdleLoop(config, prom, store, pods=store, recorder=recorder, clock=lambda: backfilled.t_end,  # type: ignore[arg-type]
                        registry=registry)  # fmt: skip
        await loop.run_once(asyncio.Event())  # not leading: nothing applied
        assert (store.patches, recorder.events) == ([], [])
        leading = asyncio.Event()
        leading.set()
        await loop.run_once(leading)
        return loop


@pytest.mark.asyncio(loop_scope="module")
async def test_a_pass_marks_idle_pods_and_events_pod_and_owner(backfilled: Backfilled) -> None:
    store, recorder, registry = PodStore(pods(backfilled.t_end)), Recorder(), CollectorRegistry()
    loop = await one_pass(backfilled, CONFIG, store, recorder, registry)
    since = rfc3339(backfilled.t_end - 1800)
    marked = {n: p["metadata"]["annotations"].get(IDLE_SINCE) for n, p in store.pods.items()}
    assert {n: v for n, v in marked.items() if v} == {"notebook": since, "old-gpu": since}
    assert sorted(recorder.events) == [
        ("Pod", "notebook", "GPUIdle"), ("Pod", "old-gpu", "GPUIdle"),
        ("ReplicaSet", "notebook-rs", "GPUIdle"), ("ReplicaSet", "old-gpu-rs", "GPUIdle"),
    ]  # fmt: skip
    assert registry.get_sample_value("gpuwarden_idle_telemetry_up") == 1
    assert registry.get_sample_value("gpuwarden_idle_gpus", {"pod_namespace": "ml"}) == 3
    # the next pass: already marked, nothing new; trainer marked by hand is cleared (busy)
    store.pods["trainer"]["metadata"]["annotations"][IDLE_SINCE] = since
    store.patches.clear()
    recorder.events.clear()
    leading = asyncio.Event()
    leading.set()
    async with backfilled.prom.client() as prom:
        loop.prom = prom
        await loop.run_once(leading)
    assert [n for n, _ in store.patches] == ["trainer"]
    assert IDLE_SINCE not in store.pods["trainer"]["metadata"]["annotations"]
    assert recorder.events == [("Pod", "trainer", "GPUIdleEnded")]


@pytest.mark.asyncio(loop_scope="module")
async def test_dry_run_writes_nothing_and_reports_once(backfilled: Backfilled) -> None:
    config = Config.model_validate({"idle": {"enabled": True}})  # dry-run by default
    store, recorder = PodStore(pods(backfilled.t_end)), Recorder()
    loop = await one_pass(backfilled, config, store, recorder, CollectorRegistry())
    assert store.patches == []
    assert sorted(e[1] for e in recorder.events if e[0] == "Pod") == ["notebook", "old-gpu"]
    recorder.events.clear()
    leading = asyncio.Event()
    leading.set()
    async with backfilled.prom.client() as prom:
        loop.prom = prom
        plan = await loop.run_once(leading)
    assert (store.patches, recorder.events, plan.marks) == ([], [], ())


@pytest.mark.asyncio(loop_scope="module")
async def test_evict_rule_evicts_pods_reported_long_enough(backfilled: Backfilled) -> None:
    config = Config.model_validate(
        {"idle": {"enabled": True, "dry_run": False, "evict_after_seconds": 3600,
                  "rules": [{"name": "ml", "namespaces": ["m?"], "action": "evict"}]}}
    )  # fmt: skip
    store, recorder = PodStore(pods(backfilled.t_end)), Recorder()
    long_ago = rfc3339(backfilled.t_end - 2 * 3600)
    for name in ("notebook", "acked", "trainer"):
        store.pods[name]["metadata"]["annotations"][IDLE_SINCE] = long_ago
    await one_pass(backfilled, config, store, recorder, CollectorRegistry())
    assert store.evictions == ["notebook"], "acked is held, trainer is busy (unmarked), old-gpu only reported"
    assert ("Pod", "notebook", "GPUIdlePodEvicted") in recorder.events
    assert ("ReplicaSet", "notebook-rs", "GPUIdlePodEvicted") in recorder.events
    assert ("Pod", "old-gpu", "GPUIdle") in recorder.events


@pytest.mark.asyncio(loop_scope="module")
async def test_power_corroboration_in_the_same_query(backfilled: Backfilled) -> None:
    config = Config.model_validate({"idle": {"enabled": True, "power_threshold_watts": 100}})
    registry = CollectorRegistry()
    async with backfilled.prom.client(registry) as prom:
        usage = await observe_usage(prom, config.idle, backfilled.t_end)
    plan = plan_from(config, pods(backfilled.t_end), usage, now=backfilled.t_end)
    got = {j.pod.key: j.verdict for j in plan.judgements}
    assert got["ml/notebook"] is Verdict.IDLE, "61.5 W: idle draw"
    assert got["ml/old-gpu"] is Verdict.BUSY, "240 W under 1 % utilization"
    assert got["ml/acked"] is Verdict.UNKNOWN, "no power data while corroboration is on"
    assert got["ml/trainer"] is Verdict.BUSY
    ok = {"endpoint": "query", "outcome": "success"}
    assert registry.get_sample_value("gpuwarden_prometheus_requests_total", ok) == 1.0
