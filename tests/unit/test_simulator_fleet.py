"""The pure fleet: load curves, placement, sticky XIDs, monotonic counters, faults at times, pod mapping."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from harness.simulator.fleet import Fleet, MappingError, PodSpec
from harness.simulator.scenario import fault_adapter, parse_scenario
from harness.simulator.workload import LoadCurve, choose_gpus

T0 = 1000.0  # the injected clock's reading at start


def make(doc: dict[str, Any] | None = None) -> Fleet:
    base: dict[str, Any] = {"fleet": {"nodes": 2, "gpus_per_node": 8, "numa_nodes": 2}}
    return Fleet(parse_scenario({**base, **(doc or {})}), start=T0)


def fault(**kw: Any) -> Any:
    return fault_adapter.validate_python({"node": "gpu-node-000", "gpu": 0, **kw})


def gpu(fleet: Fleet, node: int = 0, index: int = 0) -> Any:
    return list(fleet.nodes.values())[node].gpus[index]


@pytest.mark.parametrize(
    ("curve", "t", "qps"),
    [
        pytest.param(LoadCurve(((0, 10), (60, 70))), -5, 10, id="before-first-point"),
        pytest.param(LoadCurve(((0, 10), (60, 70))), 0, 10, id="at-first-point"),
        pytest.param(LoadCurve(((0, 10), (60, 70))), 30, 40, id="interpolated"),
        pytest.param(LoadCurve(((0, 10), (60, 70))), 60, 70, id="at-last-point"),
        pytest.param(LoadCurve(((0, 10), (60, 70))), 600, 70, id="after-last-point"),
        pytest.param(LoadCurve(((10, 0), (20, 100), (30, 0))), 25, 50, id="second-segment"),
        pytest.param(LoadCurve(((0, 10), (60, 70)), loop=120), 150, 40, id="loop-wraps"),
        pytest.param(LoadCurve(((0, 10), (60, 70)), loop=120), 100, 70, id="loop-flat-tail"),
        pytest.param(LoadCurve(((0, 10), (60, 70)), origin=1000), 1030, 40, id="origin"),
        pytest.param(LoadCurve.constant(7.5), 1e9, 7.5, id="constant"),
    ],
)
def test_load_curve(curve: LoadCurve, t: float, qps: float) -> None:
    assert curve.qps(t) == pytest.approx(qps)


@pytest.mark.parametrize(
    ("free", "want", "chosen"),
    [
        pytest.param(range(8), 4, (0, 1, 2, 3), id="lowest-numa-first"),
        pytest.param([0, 4, 5, 6, 7], 4, (4, 5, 6, 7), id="whole-numa-node-preferred"),
        pytest.param([1, 2, 3, 4, 5, 6], 4, (1, 2, 3, 4), id="spans-numa-when-it-must"),
        pytest.param([2, 6], 1, (2,), id="single-gpu"),
        pytest.param([0, 1, 2], 4, None, id="does-not-fit"),
    ],
)
def test_choose_gpus(free: Any, want: int, chosen: tuple[int, ...] | None) -> None:
    assert choose_gpus(list(free), want, 8, 2) == chosen


def test_replicas_are_placed_first_fit_on_one_numa_node() -> None:
    fleet = make(
        {"workloads": [{"name": "a", "replicas": 3}, {"name": "b", "gpus_per_pod": 4, "replicas": 2}]}
    )
    placed = {p.name: (p.node, p.gpus) for p in fleet.pods.values()}
    assert placed == {
        "a-0": ("gpu-node-000", (0,)),
        "a-1": ("gpu-node-000", (1,)),
        "a-2": ("gpu-node-000", (2,)),
        "b-0": ("gpu-node-000", (4, 5, 6, 7)),
        "b-1": ("gpu-node-001", (0, 1, 2, 3)),
    }
    assert [g.numa_node for g in fleet.nodes["gpu-node-000"].gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("codes", "last"),
    [
        pytest.param([79], 79, id="one"),
        pytest.param([13, 48], 48, id="latest-wins"),
        pytest.param([48, 13], 13, id="app-xid-overwrites-hardware-xid"),
        pytest.param([31, 31], 31, id="repeat-indistinguishable"),
    ],
)
def test_xid_is_sticky(codes: list[int], last: int) -> None:
    fleet = make()
    for i, code in enumerate(codes):
        fleet.advance(T0 + 10 * (i + 1))
        fleet.apply_fault(fault(kind="xid", code=code), fleet.now)
    fleet.advance(T0 + 86400)  # a day later, long after the count window
    assert gpu(fleet).last_xid == last
    assert gpu(fleet, 0, 1).last_xid is None


def test_xid_count_window_ages_out_but_last_xid_stays() -> None:
    fleet = make({"faults": [{"at": 10, **fault_doc(code=79)}, {"at": 100, **fault_doc(code=13, count=2)}]})

    def window() -> dict[int, int]:
        return dict(Counter(code for _, code in gpu(fleet).xid_events))

    fleet.advance(T0 + 200)
    assert window() == {79: 1, 13: 2}
    fleet.advance(T0 + 320)  # 79 was 310 s ago: outside the 300 s window
    assert window() == {13: 2}
    fleet.advance(T0 + 401)
    assert window() == {}
    assert gpu(fleet) not in fleet.xid_gpus
    assert gpu(fleet).last_xid == 13


def fault_doc(**kw: Any) -> dict[str, Any]:
    return {"kind": "xid", "node": "gpu-node-000", "gpu": 0, **kw}


COUNTERS = (
    "energy_mj", "ecc_sbe_vol", "ecc_dbe_vol", "ecc_sbe_agg", "ecc_dbe_agg", "retired_sbe", "retired_dbe",
    "retired_pending", "remapped_correctable", "remapped_uncorrectable",
)  # fmt: skip


def test_counters_are_monotonic() -> None:
    steps: list[tuple[int, str, dict[str, Any]]] = [
        (5, "ecc", {"error": "sbe", "count": 3}),
        (20, "ecc", {"error": "dbe"}),
        (30, "retired_pages", {"sbe": 1, "dbe": 2, "pending": 1}),
        (45, "remapped_rows", {"correctable": 4, "uncorrectable": 1}),
        (50, "ecc", {"error": "sbe", "count": 10}),
    ]
    faults = [{**fault_doc(**extra), "at": t, "kind": kind} for t, kind, extra in steps]
    load = [{"at": 0, "qps": 10}, {"at": 30, "qps": 200}, {"at": 60, "qps": 0}]
    fleet = make({"faults": faults, "workloads": [{"name": "w", "replicas": 2, "load": load}]})
    g, pods = gpu(fleet), list(fleet.pods.values())
    previous = [getattr(g, c) for c in COUNTERS] + [p.requests for p in pods]
    for step in range(1, 121):
        fleet.advance(T0 + step * 0.75)
        current = [getattr(g, c) for c in COUNTERS] + [p.requests for p in pods]
        assert all(b >= a for a, b in zip(previous, current, strict=True)), step
        previous = current
    assert (g.ecc_sbe_agg, g.ecc_dbe_agg, g.retired_dbe, g.remapped_uncorrectable) == (13, 1, 2, 1)


def test_requests_integrate_the_load_curve() -> None:
    load = [{"at": 0, "qps": 100}, {"at": 60, "qps": 300}]
    fleet = make({"workloads": [{"name": "w", "replicas": 2, "load": load}]})
    fleet.advance(T0 + 30)
    # integral of 100..200 over 30 s = 4500 requests, split over 2 pods
    assert [p.requests for p in fleet.pods.values()] == [pytest.approx(2250), pytest.approx(2250)]


def test_the_gateway_counts_the_whole_load_with_or_without_pods() -> None:
    fleet = make({"workloads": [{"name": "w", "replicas": 0, "load": [{"at": 0, "qps": 0}]}]})
    fleet.set_load("default", "w", LoadCurve(((0.0, 0.0), (10.0, 100.0)), fleet.now))
    for second in range(1, 21):  # 0..100 over 10 s, then 100 for 10 s: 500 + 1000, no pod served any of it
        fleet.advance(T0 + second)
    w = fleet.workloads[("default", "w")]
    assert (w.gateway_requests, w.pods) == (pytest.approx(1500), {})
    fleet.set_pods([PodSpec("default", "w-a", "gpu-node-000", (0,), "w")], replace=False)
    fleet.advance(T0 + 30)
    assert (w.gateway_requests, w.pods["w-a"].requests) == (pytest.approx(2500), pytest.approx(1000))


def test_a_workload_known_only_from_a_mapped_pod_has_no_gateway_until_a_load_is_set() -> None:
    fleet = make()
    fleet.set_pods([PodSpec("train", "job-worker-0", "gpu-node-000", (0, 1), "job")], replace=False)
    assert not fleet.workloads[("train", "job")].gateway
    fleet.set_load("train", "job", LoadCurve.constant(5, fleet.now))
    assert fleet.workloads[("train", "job")].gateway


Check = Callable[[Fleet], bool]


@pytest.mark.parametrize(
    ("doc", "applied"),
    [
        pytest.param(fault_doc(code=79), lambda f: gpu(f).last_xid == 79, id="xid"),
        pytest.param(fault_doc(kind="ecc", error="dbe"), lambda f: gpu(f).ecc_dbe_vol == 1, id="ecc"),
        pytest.param(
            fault_doc(kind="row_remap_failure"), lambda f: gpu(f).row_remap_failure == 1, id="remap-fail"
        ),
        pytest.param(fault_doc(kind="gpu_missing"), lambda f: not gpu(f).present, id="gpu-missing"),
        pytest.param(
            {"kind": "exporter_down", "node": "gpu-node-001"},
            lambda f: not f.nodes["gpu-node-001"].exporter_up,
            id="exporter-down",
        ),
        pytest.param(
            {"kind": "xid", "node": "gpu-node-000", "code": 74},
            lambda f: all(g.last_xid == 74 for g in f.nodes["gpu-node-000"].gpus),
            id="whole-node",
        ),
    ],
)
def test_scheduled_faults_apply_at_their_time(doc: dict[str, Any], applied: Check) -> None:
    fleet = make({"faults": [{"at": "30s", **doc}]})
    fleet.advance(T0 + 29.9)
    assert not applied(fleet)
    fleet.advance(T0 + 30)
    assert applied(fleet)


@pytest.mark.parametrize(
    ("doc", "active"),
    [
        pytest.param(
            {"kind": "exporter_down", "node": "gpu-node-000"},
            lambda f: not f.nodes["gpu-node-000"].exporter_up,
            id="exporter-down",
        ),
        pytest.param(fault_doc(kind="gpu_missing"), lambda f: not gpu(f).present, id="gpu-missing"),
        pytest.param(
            fault_doc(kind="row_remap_failure"), lambda f: gpu(f).row_remap_failure == 1, id="remap-fail"
        ),
    ],
)
def test_timed_conditions_expire(doc: dict[str, Any], active: Check) -> None:
    fleet = make({"faults": [{"at": 10, "duration": 20, **doc}]})
    for t, expected in [(9, False), (10, True), (29, True), (30, False), (100, False)]:
        fleet.advance(T0 + t)
        assert active(fleet) is expected, t


def test_time_moves_in_whole_ticks() -> None:
    fleet = make({"exporter": {"tick": 5}})
    assert fleet.advance(T0 + 4.9) is False
    assert fleet.now == T0
    assert fleet.advance(T0 + 12) is True
    assert (fleet.now, fleet.step) == (T0 + 10, 2)


@pytest.mark.parametrize(
    ("clear", "expect"),
    [
        pytest.param({}, {"up": True, "present": True, "remap": 0, "xid": 48, "sbe_vol": 2, "sbe_agg": 2},
                     id="conditions-only"),
        pytest.param({"reset": True}, {"up": True, "present": True, "remap": 0, "xid": None, "sbe_vol": 0,
                                       "sbe_agg": 2}, id="gpu-reset-keeps-aggregate"),
        pytest.param({"node": "gpu-node-001"}, {"up": False, "present": False, "remap": 1, "xid": 48,
                                                "sbe_vol": 2, "sbe_agg": 2}, id="other-node-untouched"),
        pytest.param({"node": "gpu-node-000", "gpu": 0}, {"up": False, "present": True, "remap": 0, "xid": 48,
                                                          "sbe_vol": 2, "sbe_agg": 2}, id="gpu-leaves-node"),
    ],
)  # fmt: skip
def test_clear_faults(clear: dict[str, Any], expect: dict[str, Any]) -> None:
    fleet = make()
    for doc in [
        {"kind": "exporter_down", "node": "gpu-node-000"},
        fault_doc(kind="gpu_missing"),
        fault_doc(kind="row_remap_failure"),
        fault_doc(code=48),
        fault_doc(kind="ecc", error="sbe", count=2),
    ]:
        fleet.apply_fault(fault_adapter.validate_python(doc), fleet.now)
    version = fleet.version
    fleet.clear_faults(clear.get("node"), clear.get("gpu"), reset=clear.get("reset", False))
    g = gpu(fleet)
    got = {
        "up": fleet.nodes["gpu-node-000"].exporter_up, "present": g.present, "remap": g.row_remap_failure,
        "xid": g.last_xid, "sbe_vol": g.ecc_sbe_vol, "sbe_agg": g.ecc_sbe_agg,
    }  # fmt: skip
    assert got == expect
    assert fleet.version > version


def test_pod_share_sets_gpu_utilization() -> None:
    fleet = make(
        {"workloads": [{"name": "w", "replicas": 2, "qps_per_gpu": 100, "load": [{"at": 0, "qps": 100}]}]}
    )
    assert [gpu(fleet, 0, i).util for i in range(3)] == [50.0, 50.0, 0.0]
    assert gpu(fleet).fb_used_mib == 16384 and gpu(fleet, 0, 2).fb_used_mib == 0
    assert gpu(fleet).power_w > gpu(fleet, 0, 2).power_w
    fleet.set_pods([PodSpec("default", "w-extra", "gpu-node-001", (0, 1), "w")], replace=False)
    # 3 pods share 100 QPS; the 2-GPU pod spreads its third over two GPUs
    assert gpu(fleet).util == pytest.approx(100 / 3)
    assert gpu(fleet, 1, 0).util == pytest.approx(100 / 6)
    fleet.unmap_pods([("default", "w-extra")])
    assert (gpu(fleet).util, gpu(fleet, 1, 0).util, gpu(fleet, 1, 0).pod) == (50.0, 0.0, None)


def test_set_pods_replace_and_upsert() -> None:
    fleet = make({"workloads": [{"name": "w", "replicas": 2, "load": [{"at": 0, "qps": 10}]}]})
    fleet.advance(T0 + 10)
    kept = fleet.pods[("default", "w-0")].requests
    fleet.set_pods([PodSpec("default", "w-0", "gpu-node-000", (0,), "w")], replace=True)
    assert list(fleet.pods) == [("default", "w-0")]
    assert fleet.pods[("default", "w-0")].requests == kept  # same pod, same mapping: counter kept
    assert gpu(fleet, 0, 1).pod is None
    fleet.set_pods([PodSpec("ml", "job", "gpu-node-001", (4, 5), "trainer", "main")], replace=False)
    assert set(fleet.pods) == {("default", "w-0"), ("ml", "job")}
    job = fleet.pods[("ml", "job")]
    assert (job.container, job.workload.name, job.workload.curve.qps(fleet.now)) == ("main", "trainer", 0.0)


@pytest.mark.parametrize(
    ("spec", "field", "conflict"),
    [
        pytest.param(PodSpec("default", "x", "gpu-node-000", (0,), "w"), "pods", True, id="gpu-taken"),
        pytest.param(PodSpec("default", "x", "nope", (0,), "w"), "pods[0].node", False, id="unknown-node"),
        pytest.param(
            PodSpec("default", "x", "gpu-node-000", (8,), "w"), "pods[0].gpus", False, id="no-such-gpu"
        ),
        pytest.param(
            PodSpec("default", "x", "gpu-node-000", (3, 3), "w"), "pods[0].gpus", False, id="repeated"
        ),
        pytest.param(PodSpec("default", "x", "gpu-node-000", (), "w"), "pods[0].gpus", False, id="empty"),
    ],
)
def test_set_pods_rejects_bad_mappings_atomically(spec: PodSpec, field: str, conflict: bool) -> None:
    fleet = make({"workloads": [{"name": "w", "replicas": 1}]})
    before = {k: (p.node, p.gpus) for k, p in fleet.pods.items()}
    with pytest.raises(MappingError) as caught:
        fleet.set_pods([spec], replace=False)
    assert (caught.value.field, caught.value.conflict) == (field, conflict)
    assert {k: (p.node, p.gpus) for k, p in fleet.pods.items()} == before


def test_set_load_changes_utilization_at_once() -> None:
    fleet = make({"workloads": [{"name": "w", "replicas": 1, "load": [{"at": 0, "qps": 10}]}]})
    version = fleet.version
    fleet.set_load("default", "w", LoadCurve.constant(80, fleet.now))
    assert gpu(fleet).util == 80.0
    assert fleet.version > version


# --- fabric and degradation signals (health.signals) ----------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "value", "attr", "during", "after"),
    [
        pytest.param("clock_event", 0x40, "clock_reasons", 0x40, 0, id="clock-event"),
        pytest.param("thermal_margin", -3, "margin_override", -3, None, id="thermal-margin"),
        pytest.param("fabric_manager", 4, "fm_status", 4, 3, id="fabric-manager"),
        pytest.param("fabric_health", 0x1A6, "fabric_mask", 0x1A6, 0x1AA, id="fabric-mask"),
        pytest.param("exporter_stall", 0, "stalled", True, False, id="stall"),
    ],
)
def test_signal_faults_hold_then_clear(kind: str, value: float, attr: str, during: Any, after: Any) -> None:
    fleet = make()
    fleet.apply_fault(fault(kind=kind, value=value, duration=10), T0)
    assert getattr(gpu(fleet), attr) == during
    assert getattr(gpu(fleet, index=1), attr) == after  # only the target GPU
    fleet.advance(T0 + 11)
    assert getattr(gpu(fleet), attr) == after


def test_signal_counters_integrate_and_a_stall_freezes_energy() -> None:
    fleet = make()
    fleet.apply_fault(fault(kind="nvlink_errors", value=100), T0)
    fleet.apply_fault(fault(kind="pcie_replay", value=2, gpu=1), T0)
    fleet.apply_fault(fault(kind="exporter_stall", gpu=2), T0)
    before = gpu(fleet, index=2).energy_mj
    fleet.advance(T0 + 10)
    assert gpu(fleet).nvlink_crc_flit == pytest.approx(1000)
    assert gpu(fleet, index=1).pcie_replays == pytest.approx(20)
    assert gpu(fleet, index=2).energy_mj == before  # frozen
    assert gpu(fleet, index=3).energy_mj > before  # the others keep counting


def test_nvswitch_fault_is_node_level_and_clears() -> None:
    fleet = make()
    body = {"kind": "nvswitch", "node": "gpu-node-000", "sxid": 12, "switch": 2, "duration": 5}
    fleet.apply_fault(fault_adapter.validate_python(body), T0)
    assert fleet.nodes["gpu-node-000"].nvswitch_sxid == {2: (12, True)}
    fleet.advance(T0 + 6)
    assert fleet.nodes["gpu-node-000"].nvswitch_sxid == {}
