"""Mixed clusters: DRA-backed GPU nodes are recognised, passed through and never given a recorded GPU set.

A node is DRA-backed when it lists no `nvidia.com/gpu` in its allocatable and a DeviceClass names the resource
in `spec.extendedResourceName` (KEP-5004; kube-scheduler's NodeResourcesFit decides the same per node).
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.extender.bind import Binder
from controller.extender.events import DRA, bind_event
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.dra import dra_class_for_node, extended_resource_classes
from controller.gpus.fit import FitVerdict, Settings, assess, filter_nodes, score_nodes
from controller.gpus.objects import node_info, pod_info
from controller.gpus.victims import revise_candidates
from tests.unit.extender_support import RESOURCE, FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)


def device_class(name: str, extended: str | None = RESOURCE) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}
    if extended is not None:
        spec["extendedResourceName"] = extended
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def dra_node(name: str) -> dict[str, Any]:
    """A node whose GPUs a DRA driver publishes in ResourceSlices: no `nvidia.com/gpu` allocatable at all."""
    obj = node(name, topo=None)
    obj["status"] = {"allocatable": {"cpu": "64", "memory": "512Gi"}, "capacity": {"cpu": "64"}}
    return obj


@pytest.mark.parametrize(
    ("classes", "want"),
    [
        ([], {}),
        ([device_class("gpu.example.com")], {RESOURCE: "gpu.example.com"}),
        ([device_class("plain", None)], {}),  # a class without the mapping (or a 1.35 server dropping it)
        ([device_class("b", RESOURCE), device_class("a", RESOURCE)], {RESOURCE: "a"}),  # stable: sorted
        ([device_class("a", ""), device_class("x", "example.com/fpga")], {"example.com/fpga": "x"}),
    ],
)
def test_extended_resource_classes(classes: list[dict[str, Any]], want: dict[str, str]) -> None:
    assert extended_resource_classes(classes) == want


@pytest.mark.parametrize(
    ("device_plugin", "classes", "want"),
    [
        (True, {RESOURCE: "gpu"}, ""),  # the device plugin owns the name on this node: the classic path
        (False, {RESOURCE: "gpu"}, "gpu"),
        (False, {}, ""),  # no GPUs at all: unknown is not DRA
        (False, {"example.com/fpga": "x"}, ""),
    ],
)
def test_dra_class_for_node(device_plugin: bool, classes: dict[str, str], want: str) -> None:
    assert dra_class_for_node(device_plugin, RESOURCE, classes) == want


def test_node_info_tells_device_plugin_nodes_from_the_others() -> None:
    assert node_info(node("dp"), RESOURCE).device_plugin
    zero = node("dp0", gpus=0)  # allocatable 0: kube-scheduler hands the name to DRA when a class maps it
    assert not node_info(zero, RESOURCE).device_plugin
    assert not node_info(dra_node("d"), RESOURCE).device_plugin


def test_model_marks_dra_nodes_once_a_device_class_maps_the_resource() -> None:
    m = model([node("dp"), dra_node("d")])
    assert m.view("d") is not None and m.view("d").dra_class == ""  # type: ignore[union-attr]
    m.set_device_classes([device_class("gpu.example.com")])
    assert m.view("d").dra_class == "gpu.example.com"  # type: ignore[union-attr]
    assert m.view("dp").dra_class == ""  # type: ignore[union-attr]
    m.set_device_classes([])  # the class deleted: the node is a node without GPUs again
    assert m.view("d").dra_class == ""  # type: ignore[union-attr]


def mixed() -> tuple[Any, list[tuple[str, Any]]]:
    m = model(
        [node("dp"), node("dp-full"), dra_node("d")], [pod("busy", 8, node="dp-full", ids="0,1,2,3,4,5,6,7")]
    )
    m.set_device_classes([device_class("gpu.example.com")])
    return m, m.views_of(["dp", "dp-full", "d"])


def test_filter_passes_dra_nodes_unjudged_and_judges_the_others_as_before() -> None:
    _, views = mixed()
    incoming = pod_info(pod("p", 4), RESOURCE)
    result = filter_nodes(incoming, views, SETTINGS, NOW)
    assert result.passed == ("dp", "d")
    assert result.dra == ("d",)
    assert set(result.failed) | set(result.unresolvable) == {"dp-full"}


def test_prioritize_gives_dra_nodes_no_score() -> None:
    _, views = mixed()
    scores = dict(score_nodes(pod_info(pod("p", 4), RESOURCE), views, SETTINGS, NOW))
    assert scores["d"] == 0 and scores["dp"] > 0


def test_no_gpu_set_is_promised_on_a_dra_node() -> None:
    """make-room, GPU preemption and `choose_gpus` go through `assess`: on a DRA node it never fits."""
    m, _ = mixed()
    verdict = assess(pod_info(pod("p", 1), RESOURCE), m.view("d"), SETTINGS, NOW, "d")
    assert isinstance(verdict, FitVerdict) and not verdict.resolvable
    assert "through DRA (DeviceClass gpu.example.com)" in verdict.reason


def binding(name: str, target: str) -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node=target)


async def test_bind_on_a_dra_node_binds_without_a_claim() -> None:
    api = FakePodApi([pod("p", 4)])
    m, _ = mixed()
    m.upsert_pod(api.pods["ml/p"])
    outcome = await Binder(api, m, lambda: SETTINGS, clock=lambda: NOW).bind(binding("p", "d"))
    assert outcome.kind == "bound" and outcome.dra_class == "gpu.example.com" and outcome.choice is None
    assert "through DRA (DeviceClass gpu.example.com)" in outcome.passthrough
    assert api.calls == ["bind ml/p d"]  # no claim patch, no list: DRA allocated the devices already
    annotations = api.pods["ml/p"]["metadata"].get("annotations") or {}
    assert "gpuwarden.io/gpu-ids" not in annotations


async def test_bind_on_a_device_plugin_node_still_claims() -> None:
    api = FakePodApi([pod("p", 4)])
    m, _ = mixed()
    m.upsert_pod(api.pods["ml/p"])
    outcome = await Binder(api, m, lambda: SETTINGS, clock=lambda: NOW).bind(binding("p", "dp"))
    assert outcome.kind == "bound" and outcome.choice is not None and not outcome.dra_class
    assert api.calls[0] == "patch ml/p"


def test_dra_bind_event_explains_the_passthrough() -> None:
    event = bind_event(binding("p", "d"), kind="bound", dra_class="gpu.example.com")
    assert event is not None and event.reason == DRA
    assert "node d serves its GPUs through DRA (DeviceClass gpu.example.com)" in event.note
    assert "records no GPU set" in event.note


def test_preempt_verb_keeps_the_schedulers_victims_on_a_dra_node() -> None:
    """No GPU victims are added or swapped where DRA allocates; an empty candidate is not filled in."""
    m, _ = mixed()
    m.upsert_pod(pod("low", 2, node="d", priority=0))
    views = {"d": m.view("d")}
    incoming = pod_info(pod("p", 4, priority=100), RESOURCE)
    revised = revise_candidates(incoming, {"d": ["uid-low"]}, views, SETTINGS, NOW)
    assert dict(revised.victims) == {"d": ("uid-low",)}
    empty = revise_candidates(incoming, {"d": []}, views, SETTINGS, NOW)
    assert dict(empty.victims) == {}
