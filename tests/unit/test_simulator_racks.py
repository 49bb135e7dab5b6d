"""NVL72-shaped fleets: the simulator's trays and the test bed's kwok Nodes agree on names and cliques,
racks share a clique id under different cluster UUIDs, and the NVLinks-down fault shows on every GPU of its
tray only, in the fabric series dcgm-exporter serves."""

from __future__ import annotations

from controller.gpus.domains import domains_of
from controller.health.signals import fabric_health_faults
from harness.simulator import Fleet, parse_scenario
from harness.simulator import racks as nvl72
from harness.simulator.exposition import Renderer
from harness.simulator.scenario import fault_adapter
from harness.testbed.nodes import nvl72_node_specs

T0 = 1_700_000_000.0


def test_kwok_trays_form_one_domain_per_rack_of_18_trays_of_4_gpus() -> None:
    specs = nvl72_node_specs(2, labels={"example.com/pool": "train"})
    assert len(specs) == 36 and {s.gpus for s in specs} == {4}
    manifests = [s.manifest() for s in specs]
    assert {m["metadata"]["labels"]["example.com/pool"] for m in manifests} == {"train"}
    domains = domains_of(manifests, nvl72.CLIQUE_LABEL, "nvidia.com/gpu")
    assert [len(d.members) for d in domains.values()] == [18, 18]
    assert {d.gpus for d in domains.values()} == {72}
    assert {d.clique_id for d in domains.values()} == {str(nvl72.CLIQUE_ID)}  # one id, two racks
    sim_names = parse_scenario(nvl72.scenario(2)).fleet.node_names()
    assert sim_names == [s.name for s in specs]


def test_nvlinks_down_is_a_fabric_fault_on_every_gpu_of_one_tray() -> None:
    assert set(fabric_health_faults(nvl72.NVLINKS_DOWN_MASK)) == {"degraded_bw", "route_unhealthy"}
    fleet = Fleet(parse_scenario(nvl72.scenario(1, exporter={"tick": 1})), start=T0)
    down = nvl72.tray_name(3)
    for fault in nvl72.nvlinks_down(down):
        fleet.apply_fault(fault_adapter.validate_python(fault), T0)
    fleet.advance(T0 + 10)
    text = Renderer(fleet).render()
    masks = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FABRIC_HEALTH_MASK{")]
    assert len(masks) == 18 * 4
    faulty = [line for line in masks if f'Hostname="{down}"' in line]
    assert len(faulty) == 4 and all(line.endswith(f" {nvl72.NVLINKS_DOWN_MASK}") for line in faulty)
    assert all(line.endswith(" 426") for line in masks if line not in faulty)  # 0x1AA: healthy
    flit = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{"
    flits = [line for line in text.splitlines() if line.startswith(flit) and f'Hostname="{down}"' in line]
    assert len(flits) == 4 and all(float(line.rsplit(" ", 1)[1]) > 0 for line in flits)
