"""Shared GPUs in the GPU model and the extender: a node that time-slices, runs MPS or MIG is passed through
with its reason, never given a GPU set (no `0..31` on a node of 8 GPUs), and whole-GPU nodes are judged
as before. One row per sharing mode.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.extender.answers import answer, filter_body
from controller.extender.bind import Binder
from controller.extender.events import SHARED, bind_event
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import FitVerdict, Settings, assess, filter_nodes, score_nodes
from controller.gpus.objects import node_info, pod_info
from controller.gpus.victims import revise_candidates
from gpuwarden.gpusharing import SharingMode
from tests.unit.extender_support import RESOURCE, FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)
H100 = "NVIDIA-H100-80GB-HBM3"
COUNT, STRATEGY, MIG = "nvidia.com/gpu.count", "nvidia.com/gpu.sharing-strategy", "nvidia.com/mig.strategy"

SHAPES: dict[str, tuple[dict[str, str], dict[str, str], SharingMode]] = {
    "time-sliced": (
        {
            COUNT: "8",
            "nvidia.com/gpu.replicas": "4",
            STRATEGY: "time-slicing",
            "nvidia.com/gpu.product": H100 + "-SHARED",
        },
        {RESOURCE: "32"},
        SharingMode.TIME_SLICING,
    ),
    "mps": (
        {COUNT: "8", "nvidia.com/gpu.replicas": "2", STRATEGY: "mps"},
        {RESOURCE: "16"},
        SharingMode.MPS,
    ),
    "mig-single": (
        {MIG: "single", COUNT: "56", "nvidia.com/gpu.product": H100 + "-MIG-1g.10gb"},
        {RESOURCE: "56"},
        SharingMode.MIG_SINGLE,
    ),
    "mig-mixed": (
        {MIG: "mixed", COUNT: "8", "nvidia.com/mig-1g.10gb.count": "28"},
        {RESOURCE: "4", "nvidia.com/mig-1g.10gb": "28"},
        SharingMode.MIG_MIXED,
    ),
}


def shared_node(name: str, shape: str, **kw: Any) -> dict[str, Any]:
    labels, capacity, _ = SHAPES[shape]
    obj = node(name, int(capacity[RESOURCE]), topo=None, **kw)
    obj["metadata"]["labels"] = dict(labels)
    obj["status"]["capacity"] = dict(capacity)
    obj["status"]["allocatable"] = dict(capacity)
    return obj


@pytest.mark.parametrize("shape", list(SHAPES))
def test_node_info_reads_the_sharing_mode(shape: str) -> None:
    info = node_info(shared_node("s", shape), RESOURCE)
    assert info.sharing.mode is SHAPES[shape][2]
    assert info.device_plugin  # a device plugin serves these nodes: never mistaken for DRA


def test_whole_node_is_not_shared() -> None:
    assert node_info(node("w"), RESOURCE).sharing.mode is SharingMode.WHOLE


@pytest.mark.parametrize("shape", list(SHAPES))
def test_filter_passes_shared_nodes_through_with_the_reason(shape: str) -> None:
    m = model([node("w"), shared_node("s", shape)])
    incoming = pod_info(pod("p", 2, policy="single-numa"), RESOURCE)
    result = filter_nodes(incoming, m.views_of(["w", "s"]), SETTINGS, NOW)
    assert result.passed == ("w", "s") and result.shared == ("s",) and result.dra == ()
    verdict = assess(incoming, m.view("s"), SETTINGS, NOW, "s")
    assert isinstance(verdict, FitVerdict) and verdict.choice is None and not verdict.resolvable
    assert "node s shares its GPUs" in verdict.reason and "records no GPU set" in verdict.reason
    scores = dict(score_nodes(incoming, m.views_of(["w", "s"]), SETTINGS, NOW))
    assert scores["s"] == 0 and scores["w"] > 0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_pre_encoded_answers_count_shared_nodes_apart(shape: str) -> None:
    """The lean route (`answers.py`) gives the same verdict as `filter_nodes`, counted as shared."""
    m = model([node("w"), shared_node("s", shape)])
    incoming = pod_info(pod("p", 2), RESOURCE)
    answers = [answer(incoming, n, v, SETTINGS, NOW) for n, v in m.views_of(["w", "s"])]
    body, counts = filter_body(incoming, answers, SETTINGS, NOW)
    assert json.loads(body)["NodeNames"] == ["w", "s"]
    assert (counts.passed, counts.shared, counts.dra) == (1, 1, 0)


def binding(name: str, target: str) -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node=target)


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_bind_on_a_shared_node_records_no_gpu_set(shape: str) -> None:
    api = FakePodApi([pod("p", 2)])
    m = model([node("w"), shared_node("s", shape)])
    m.upsert_pod(api.pods["ml/p"])
    outcome = await Binder(api, m, lambda: SETTINGS, clock=lambda: NOW).bind(binding("p", "s"))
    assert outcome.kind == "bound" and outcome.choice is None and not outcome.dra_class
    assert "shares its GPUs" in outcome.passthrough
    assert api.calls == ["bind ml/p s"]  # no claim, no recorded set
    assert "gpuwarden.io/gpu-ids" not in (api.pods["ml/p"]["metadata"].get("annotations") or {})
    event = bind_event(binding("p", "s"), kind="bound", passthrough=outcome.passthrough)
    assert event is not None and event.reason == SHARED and "shares its GPUs" in event.note


def test_shared_note_names_the_physical_count() -> None:
    m = model([shared_node("s", "time-sliced")])
    view = m.view("s")
    assert view is not None
    assert "time-slicing: 8 physical GPUs, 4 replicas each (32 nvidia.com/gpu)" in view.passthrough


def test_preempt_verb_adds_no_gpu_victims_on_a_shared_node() -> None:
    m = model([shared_node("s", "time-sliced")], [pod("low", 2, node="s", priority=0)])
    incoming = pod_info(pod("p", 4, priority=100), RESOURCE)
    revised = revise_candidates(incoming, {"s": ["uid-low"]}, {"s": m.view("s")}, SETTINGS, NOW)
    assert dict(revised.victims) == {"s": ("uid-low",)}
    assert dict(revise_candidates(incoming, {"s": []}, {"s": m.view("s")}, SETTINGS, NOW).victims) == {}


def test_plan_shows_each_nodes_sharing_mode_and_physical_count() -> None:
    from controller.app import ControllerPlan
    from controller.gpus.shared import sharing_rows

    infos = [
        node_info(n, RESOURCE) for n in (shared_node("ts", "time-sliced"), shared_node("mig", "mig-single"))
    ]
    infos.append(node_info(node("w"), RESOURCE))
    rows = sharing_rows(infos)
    assert [(r["node"], r["mode"], r["physical_gpus"], r["slots"]) for r in rows] == [
        ("mig", "mig-single", None, 56),
        ("ts", "time-slicing", 8, 32),
        ("w", "whole", 8, 8),
    ]
    plan = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, gpus=rows)
    assert plan.to_dict()["gpus"] == rows
    table = plan.render_table()
    assert table.startswith("GPU NODES")
    assert "ts    time-slicing" in table and "32 nvidia.com/gpu (4 per GPU)" in table
    assert "mig-single (1g.10gb)  unknown" in table
