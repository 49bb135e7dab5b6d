"""The demo's `fault` action with `gpus_of`: which GPUs it strikes is looked up from the pods bound now."""

from __future__ import annotations

import io
from typing import Any

import pytest

from harness.demo.actions import ActionFailed, Actions
from harness.demo.observer import ClusterView
from harness.demo.scenario import Faults
from harness.demo.timeline import Timeline


def pod(name: str, node: str, gpus: str, app: str = "llm") -> dict[str, Any]:
    meta = {
        "name": name,
        "namespace": "inf",
        "labels": {"app": app},
        "annotations": {"gpuwarden.io/gpu-ids": gpus},
    }
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def actions(*pods: dict[str, Any]) -> Actions:
    view = ClusterView(kube=None)  # type: ignore[arg-type]
    view.pods.store = {f"inf/{p['metadata']['name']}": p for p in pods}
    return Actions(None, view, None, None, Timeline(stream=io.StringIO()))  # type: ignore[arg-type]


def fault(*nodes: str) -> Faults:
    doc = {
        "kind": "xid",
        "code": 79,
        "nodes": list(nodes),
        "gpus_of": {"workload": "llm", "namespace": "inf"},
    }
    return Faults.model_validate(doc)


def test_the_first_pod_by_name_on_each_node_gives_the_gpus() -> None:
    a = actions(
        pod("llm-b", "n5", "2"), pod("llm-a", "n5", "6,7"), pod("llm-c", "n1", "0"), pod("x", "n5", "3", "x")
    )
    chosen, said = a._held_gpus(fault("n5", "n1"))
    assert chosen == {"n5": [6, 7], "n1": [0]}
    assert said == "n5 GPU 6,7 (held by llm-a); n1 GPU 0 (held by llm-c)"


def test_no_pod_of_the_workload_on_the_node_fails_the_action() -> None:
    with pytest.raises(ActionFailed, match="no pod of inf/llm holds a GPU on n2"):
        actions(pod("llm-a", "n5", "2"))._held_gpus(fault("n2"))
