"""Shared GPUs in the simulator: time-sliced and MIG nodes in dcgm-exporter's exact series shapes.

One fleet of three 2-GPU nodes: gpu-node-000 whole GPUs, gpu-node-001 time-sliced (4 replicas per GPU),
gpu-node-002 MIG (single, 2 x 3g.40gb per GPU unless a test says otherwise). Shapes follow
reference/gpu-sharing.md section 4: MIG series per GPU instance with the parent's UUID, `gpu` and `device`
and no DCGM_FI_DEV_GPU_UTIL; one pod per time-sliced GPU series by default; per-pod `vgpu` copies (and
per-process GPU_UTIL / FB_USED beside the device series) under `exporter.virtual_gpus`.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuwarden.errors import ConfigError
from gpuwarden.gpusharing import device_ref
from harness.simulator import Simulator, build_app
from harness.simulator.exposition import Renderer
from harness.simulator.fleet import Fleet, MappingError, PodSpec
from harness.simulator.hardware import gi_ids
from harness.simulator.scenario import fault_adapter, parse_scenario

WHOLE, SLICED, MIG = "gpu-node-000", "gpu-node-001", "gpu-node-002"
LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(?P<k>[A-Za-z_][A-Za-z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')


def scenario(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "fleet": {
            "nodes": 3,
            "gpus_per_node": 2,
            "node_sharing": {
                SLICED: {"mode": "time-slicing", "replicas": 4},
                MIG: {"mode": "mig-single", "mig_instances": ["3g.40gb", "3g.40gb"]},
            },
        },
        "workloads": [{"name": "w", "replicas": 0, "qps_per_gpu": 100, "load": [{"at": 0, "qps": 60}]}],
    }
    for key, value in over.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


def make(**over: Any) -> Fleet:
    return Fleet(parse_scenario(scenario(**over)), start=0.0)


def pod(name: str, node: str, *gpus: int, slots: tuple[int, ...] | None = None) -> PodSpec:
    return PodSpec("default", name, node, gpus, "w", slots=slots)


def samples(fleet: Fleet, name: str, node: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in Renderer(fleet).render(node=node, apps=False).splitlines():
        m = LINE.match(line)
        if m and m["name"] == name:
            out.append(({lm["k"]: lm["v"] for lm in LABEL.finditer(m["labels"])}, float(m["value"])))
    return out


def inject(fleet: Fleet, **doc: Any) -> None:
    fleet.apply_fault(fault_adapter.validate_python(doc), fleet.now)


# ------------------------------------------------------------------------------------------- the scenario
@pytest.mark.parametrize(
    ("over", "field", "message"),
    [
        pytest.param(
            {"fleet": {"sharing": {"mode": "time-slicing", "replicas": 1}}},
            "fleet.sharing.replicas",
            "greater than or equal to 2",
            id="one-replica-is-no-sharing",
        ),
        pytest.param(
            {"fleet": {"sharing": {"mode": "mig-single", "mig_instances": ["4g.40gb", "4g.40gb"]}}},
            "fleet.sharing.mig_instances",
            "8 compute slices do not fit",
            id="mig-layout-too-big",
        ),
        pytest.param(
            {"fleet": {"sharing": {"mode": "mig-mixed", "mig_instances": ["1g.10gb", "big"]}}},
            "fleet.sharing.mig_instances",
            "not MIG profiles",
            id="not-a-profile",
        ),
        pytest.param(
            {"fleet": {"sharing": {"mode": "mig-single", "mig_instances": ["3g.40gb", "1g.10gb"]}}},
            "fleet.sharing.mig_instances",
            "one profile",
            id="mig-single-mixes-profiles",
        ),
        pytest.param(
            {"fleet": {"sharing": {"mode": "time-slicing", "mig_instances": ["1g.10gb"]}}},
            "fleet.sharing.mig_instances",
            "only for MIG",
            id="instances-without-mig",
        ),
        pytest.param(
            {"fleet": {"node_sharing": {"gpu-node-009": {"mode": "mps"}}}},
            "fleet.node_sharing.gpu-node-009",
            "unknown node",
            id="unknown-node",
        ),
        pytest.param(
            {"faults": [{"kind": "xid", "node": MIG, "gpu": 0, "code": 43, "instance": 2}]},
            "faults[0].instance",
            "2 MIG instances per GPU",
            id="no-such-instance",
        ),
    ],
)
def test_bad_sharing_is_reported_by_field(over: dict[str, Any], field: str, message: str) -> None:
    doc = scenario()
    for key, value in over.items():
        if key == "fleet":
            doc["fleet"] = {**doc["fleet"], **value}
            if "node_sharing" not in value and "sharing" in value:
                doc["fleet"]["node_sharing"] = {}
        else:
            doc[key] = value
    with pytest.raises(ConfigError) as info:
        parse_scenario(doc)
    problems = dict(info.value.problems)
    assert field in problems, problems
    assert message in problems[field]


@pytest.mark.parametrize(
    ("profiles", "ids"),
    [
        pytest.param(["1g.10gb"] * 7, [7, 8, 9, 10, 11, 12, 13], id="all-1g"),
        pytest.param(["2g.20gb"] * 3, [3, 4, 5], id="all-2g"),
        pytest.param(["3g.40gb"] * 2, [1, 2], id="all-3g"),
        pytest.param(["7g.80gb"], [0], id="one-7g"),
        pytest.param(["4g.40gb", "3g.40gb"], [1, 2], id="4g-takes-1"),
        pytest.param(["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], [1, 3, 7, 8], id="balanced"),
    ],
)
def test_gpu_instance_ids_as_nvml_hands_them_out(profiles: list[str], ids: list[int]) -> None:
    assert gi_ids(profiles) == ids


# --------------------------------------------------------------------------------------------- time-slicing
def test_time_sliced_gpu_has_one_series_attributed_to_the_last_pod_mapped() -> None:
    fleet = make()
    fleet.set_pods([pod("a", SLICED, 0), pod("b", SLICED, 0)], replace=False)
    util = samples(fleet, "DCGM_FI_DEV_GPU_UTIL", SLICED)
    assert [(lab["gpu"], lab.get("pod"), v) for lab, v in util] == [("0", "b", 60.0), ("1", None, 0.0)]
    assert not any("vgpu" in lab or "GPU_I_ID" in lab for lab, _ in util)
    # a and b each serve 30 QPS of 100 per GPU: their demands add up on the one GPU they share
    assert [p["slots"] for p in _state(fleet)] == [[0], [1]]
    fleet.unmap_pods([("default", "b")])
    util = samples(fleet, "DCGM_FI_DEV_GPU_UTIL", SLICED)
    assert [(lab["gpu"], lab.get("pod"), v) for lab, v in util] == [("0", "a", 60.0), ("1", None, 0.0)]
    fleet.set_pods([pod("c", SLICED, 0)], replace=False)
    assert samples(fleet, "DCGM_FI_DEV_GPU_UTIL", SLICED)[0][0]["pod"] == "c"


def test_time_sliced_demand_is_capped_at_a_whole_gpu() -> None:
    fleet = make()
    fleet.set_pods([pod(f"p{i}", SLICED, 1) for i in range(4)], replace=False)
    fleet.set_load("default", "w", fleet.workloads[("default", "w")].curve.constant(1000.0))
    (lab, value), *_ = [s for s in samples(fleet, "DCGM_FI_DEV_GPU_UTIL", SLICED) if s[0]["gpu"] == "1"]
    assert (lab["pod"], value) == ("p3", 100.0)


def _state(fleet: Fleet) -> list[dict[str, Any]]:
    from harness.simulator.control import state_json

    return list(state_json(fleet)["pods"])


def test_replica_ids_resolve_to_their_physical_gpu() -> None:
    fleet = make()
    fleet.set_pods([pod("a", SLICED, 1, 1), pod("w0", WHOLE, 1), pod("m", MIG, 0)], replace=False)
    by_pod = {p.name: fleet.device_ids(p) for p in fleet.pods.values()}
    sliced = fleet.nodes[SLICED].gpus[1].uuid
    assert by_pod["a"] == [f"{sliced}::0", f"{sliced}::1"]
    assert {device_ref(d).gpu for d in by_pod["a"]} == {sliced}
    assert [device_ref(d).replica for d in by_pod["a"]] == [0, 1]
    assert by_pod["w0"] == [fleet.nodes[WHOLE].gpus[1].uuid]
    assert by_pod["m"][0].startswith("MIG-") and device_ref(by_pod["m"][0]).gpu == ""


@pytest.mark.parametrize(
    ("specs", "field", "conflict"),
    [
        pytest.param([pod("a", SLICED, 0, slots=(4,))], "pods[0].slots", False, id="no-such-replica"),
        pytest.param([pod("a", MIG, 0, slots=(2,))], "pods[0].slots", False, id="no-such-instance"),
        pytest.param([pod("a", WHOLE, 0, slots=(0,))], "pods[0].slots", False, id="whole-gpus-have-no-slots"),
        pytest.param([pod("a", WHOLE, 0, 0)], "pods[0].gpus", False, id="whole-gpu-twice"),
        pytest.param([pod("a", SLICED, 0, 0, slots=(1, 1))], "pods[0].slots", False, id="one-replica-twice"),
        pytest.param([pod("a", SLICED, 0, slots=(0, 1))], "pods[0].slots", False, id="slots-per-gpu"),
        pytest.param(
            [pod("a", SLICED, 0, slots=(2,)), pod("b", SLICED, 0, slots=(2,))],
            "pods",
            True,
            id="replica-taken",
        ),
        pytest.param([pod(f"p{i}", MIG, 1) for i in range(3)], "pods", True, id="instances-exhausted"),
    ],
)
def test_impossible_mappings_name_the_field(specs: list[PodSpec], field: str, conflict: bool) -> None:
    fleet = make()
    with pytest.raises(MappingError) as info:
        fleet.set_pods(specs, replace=True)
    assert (info.value.field, info.value.conflict) == (field, conflict)
    assert fleet.pods == {}


def test_remapping_a_pod_keeps_its_replica_and_others_take_the_next_free_one() -> None:
    fleet = make()
    fleet.set_pods([pod("a", SLICED, 0, slots=(2,))], replace=False)
    fleet.set_pods([pod("b", SLICED, 0), pod("a", SLICED, 0)], replace=False)
    assert {p.name: p.slots for p in fleet.pods.values()} == {"a": (2,), "b": (0,)}


# ------------------------------------------------------------------------------------------------------ MIG
def test_mig_gpu_has_one_series_per_instance_with_the_parents_identity() -> None:
    fleet = make()
    fleet.set_pods([pod("m", MIG, 1, slots=(1,))], replace=False)
    fleet.set_load("default", "w", fleet.workloads[("default", "w")].curve.constant(12.0))
    gr = samples(fleet, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", MIG)
    parent = fleet.nodes[MIG].gpus[1]
    assert [(lab["gpu"], lab["GPU_I_PROFILE"], lab["GPU_I_ID"], lab.get("pod")) for lab, _ in gr] == [
        ("0", "3g.40gb", "1", None),
        ("0", "3g.40gb", "2", None),
        ("1", "3g.40gb", "1", None),
        ("1", "3g.40gb", "2", "m"),
    ]
    held = gr[3][0]
    assert (held["UUID"], held["device"], held["pci_bus_id"]) == (parent.uuid, "nvidia1", parent.pci_bus_id)
    # 12 % of a whole GPU's work on 3 of its 7 slices; a little under util/100, as the simulator's GR does
    assert gr[3][1] == pytest.approx(12 * 7 / 3 * 0.0095, abs=1e-6)
    assert samples(fleet, "DCGM_FI_DEV_GPU_UTIL", MIG) == []  # not supported on MIG
    text = Renderer(fleet).render(node=MIG, apps=False)
    order = next(
        line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_USED{") and "pod=" in line
    )
    assert order.index("modelName=") < order.index("GPU_I_PROFILE=") < order.index("GPU_I_ID=")
    assert order.index("GPU_I_ID=") < order.index("Hostname=") < order.index("container=")


def test_gpu_level_fields_repeat_on_every_instance_and_xids_stay_on_their_instance() -> None:
    fleet = make()
    inject(fleet, kind="ecc", node=MIG, gpu=0, error="dbe", count=2)
    inject(fleet, kind="xid", node=MIG, gpu=0, code=43, instance=1)
    inject(fleet, kind="xid", node=MIG, gpu=1, code=79)  # GPU-wide: flex mode watches no GPU entity there
    ecc = samples(fleet, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", MIG)
    assert [(lab["gpu"], lab["GPU_I_ID"], v) for lab, v in ecc] == [
        ("0", "1", 2.0),
        ("0", "2", 2.0),
        ("1", "1", 0.0),
        ("1", "2", 0.0),
    ]
    xid = samples(fleet, "DCGM_FI_DEV_XID_ERRORS", MIG)
    assert [(lab["gpu"], lab["GPU_I_ID"], lab["err_code"], v) for lab, v in xid] == [("0", "2", "43", 43.0)]
    count = [
        (lab["gpu"], lab["GPU_I_ID"], lab.get("xid"), v)
        for lab, v in samples(fleet, "DCGM_EXP_XID_ERRORS_COUNT", MIG)
        if v
    ]
    assert count == [("0", "2", "43", 1.0)]
    fleet.clear_faults(MIG, 0, reset=True)
    assert samples(fleet, "DCGM_FI_DEV_XID_ERRORS", MIG) == []


def test_missing_mig_gpu_drops_every_instance_series() -> None:
    fleet = make()
    inject(fleet, kind="gpu_missing", node=MIG, gpu=1)
    assert {lab["gpu"] for lab, _ in samples(fleet, "DCGM_FI_DEV_GPU_TEMP", MIG)} == {"0"}


# ----------------------------------------------------------------------------------------- virtual GPUs
def test_virtual_gpus_copy_each_series_per_pod_and_split_util_per_process() -> None:
    fleet = make(exporter={"virtual_gpus": True})
    fleet.set_pods([pod("a", SLICED, 0), pod("b", SLICED, 0), pod("w0", WHOLE, 1)], replace=False)
    gr = samples(fleet, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", SLICED)
    assert [(lab["gpu"], lab.get("pod"), lab.get("vgpu"), v) for lab, v in gr] == [
        ("0", "a", "0", 0.38),
        ("0", "b", "1", 0.38),  # copies carry the device's value
        ("1", None, None, 0.0),  # a GPU no pod holds keeps its plain series
    ]
    util = samples(fleet, "DCGM_FI_DEV_GPU_UTIL", SLICED)
    assert [(lab["gpu"], lab.get("pod"), lab.get("vgpu"), "pod_uid" in lab, v) for lab, v in util] == [
        ("0", None, None, False, 40.0),  # the device series stays
        ("0", "a", "0", True, 20.0),  # each pod's own processes
        ("0", "b", "1", True, 20.0),
        ("1", None, None, False, 0.0),
    ]
    whole = samples(fleet, "DCGM_FI_DEV_GPU_UTIL", WHOLE)
    assert [(lab["gpu"], lab.get("pod"), lab.get("vgpu")) for lab, _ in whole] == [
        ("0", None, None),
        ("1", None, None),
        ("1", "w0", None),
    ]


def test_virtual_gpus_on_mig_copy_per_instance_without_vgpu() -> None:
    fleet = make(exporter={"virtual_gpus": True})
    fleet.set_pods([pod("m", MIG, 0, slots=(0,))], replace=False)
    fb = samples(fleet, "DCGM_FI_DEV_FB_USED", MIG)
    held = [(lab["GPU_I_ID"], lab.get("pod"), "pod_uid" in lab) for lab, _ in fb if lab["gpu"] == "0"]
    assert held == [("1", None, False), ("1", "m", True), ("2", None, False)]
    assert not any("vgpu" in lab for lab, _ in samples(fleet, "DCGM_FI_DEV_GPU_TEMP", MIG))


# ---------------------------------------------------------------------------------------------- control API
async def test_control_api_maps_pods_to_replicas_and_shows_them() -> None:
    sim = Simulator(parse_scenario(scenario()), lambda: 100.0)
    async with TestClient(TestServer(build_app(sim))) as client:
        body = {"pods": [{"pod": "a", "node": SLICED, "gpus": [1], "slots": [3], "workload": "w"}]}
        assert (await client.put("/control/pods", json=body)).status == 200
        state = await (await client.get("/control/state")).json()
        uuid = sim.fleet.nodes[SLICED].gpus[1].uuid
        assert state["pods"][0]["devices"] == [f"{uuid}::3"] and state["pods"][0]["slots"] == [3]
        node = await (await client.get(f"/control/nodes/{SLICED}")).json()
        assert node["gpus"][1]["holders"] == [{"replica": 3, "pod": "default/a"}]
        node = await (await client.get(f"/control/nodes/{MIG}")).json()
        assert [i["gpu_i_id"] for i in node["gpus"][0]["mig_instances"]] == [1, 2]
        fault = {"kind": "xid", "node": MIG, "gpu": 0, "code": 43, "instance": 5}
        resp = await client.post("/control/faults", json=fault)
        assert resp.status == 400
        assert (await resp.json())["problems"][0]["field"] == "instance"
        bad = {"pods": [{"pod": "b", "node": SLICED, "gpus": [1], "slots": [3], "workload": "w"}]}
        assert (await client.post("/control/pods", json=bad)).status == 409
