"""Remediation hand-off after a drain, on the real API server (kwok nodes, a real CRD for the step object).

A drained node is handed to the configured steps in order: a `GPUReset` object (a CRD created here, as a
maintenance CR would be), then a reboot label, then a replace annotation. The object reports failure, the
label and annotation steps time out: each step ends in a recorded outcome, the markers of a finished step are
removed, and the hand-off ends `exhausted` with an Event. On a second node the node is released mid-step:
the step succeeds and its marker is removed at once (nothing acts on a healthy node).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.drain.loop import DrainLoop
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import REMEDIATION as REMEDIATION_ANNOTATION
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, poll

pytestmark = pytest.mark.e2e
SUFFIX = uuid.uuid4().hex[:5]
NODE, NODE2 = f"rm-{SUFFIX}-a", f"rm-{SUFFIX}-b"
GROUP = "e2e.gpuwarden.io"
REBOOT_LABEL = "remediation.example.com/reboot"
REPLACE_ANNOTATION = "remediation.example.com/replace"
TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gpuresets.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Cluster",
             "names": {"plural": "gpuresets", "singular": "gpureset", "kind": "GPUReset"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}  # fmt: skip
TEMPLATE = f"""apiVersion: {GROUP}/v1
kind: GPUReset
metadata:
  name: "{{node}}-reset"
spec:
  node: "{{node}}"
  uuids: "{{gpus}}"
"""


def steps(first_timeout: float) -> list[dict[str, Any]]:
    return [
        {"name": "gpu-reset", "action": "object", "resource": "gpuresets", "template": TEMPLATE,
         "timeout_seconds": first_timeout},
        {"name": "reboot", "action": "label", "key": REBOOT_LABEL, "timeout_seconds": 3},
        {"name": "replace", "action": "annotation", "key": REPLACE_ANNOTATION, "timeout_seconds": 3},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> Iterator[list[str]]:
    cluster.apply(CRD)
    poll(lambda: cluster.kubectl("get", "gpuresets", check=False) is not None
         and cluster.kubectl("api-resources", "--api-group", GROUP, check=False).count("gpuresets") > 0,
         timeout=60, what="CRD established")  # fmt: skip
    topo = {str(g): {"numa": 0, "uuid": f"GPU-{SUFFIX}-{g}"} for g in range(4)}
    taint = {"key": "gpuwarden.io/e2e-pool", "value": SUFFIX, "effect": "NoSchedule"}
    names = add_gpu_nodes(
        cluster, [GpuNodeSpec(name=n, gpus=4, topology=topo, taints=[taint]) for n in (NODE, NODE2)]
    )
    try:
        yield names
    finally:
        delete_nodes(cluster, names)
        cluster.kubectl("delete", "gpuresets", "--all", "--wait=false", check=False)
        cluster.kubectl("delete", "crd", f"gpuresets.{GROUP}", "--wait=false", check=False)


def quarantine(cluster: Cluster, node: str, on: bool) -> None:
    current = cluster.get_json("node", node)
    taints = [t for t in current["spec"].get("taints", []) if t["key"] != TAINT["key"]]
    record = None
    if on:
        taints.append(TAINT)
        ev = Evidence("xid-79", gpu=f"GPU-{SUFFIX}-1", xid=79)
        record = QuarantineRecord("quarantined", "xid-79", evidence=(ev,)).encode()
    patch = {"metadata": {"annotations": {"gpuwarden.io/quarantine": record}}, "spec": {"taints": taints}}
    cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps(patch))


def label(cluster: Cluster, node: str, key: str) -> str | None:
    labels: dict[str, str] = cluster.get_json("node", node)["metadata"].get("labels", {})
    return labels.get(key)


def node_events(cluster: Cluster, node: str) -> list[str]:
    selector = f"involvedObject.name={node}"
    out = cluster.kubectl("get", "events", "-n", "default", "--field-selector", selector,
                          "-o", "jsonpath={.items[*].reason}")  # fmt: skip
    return out.split()


def state(cluster: Cluster, node: str) -> dict[str, Any]:
    text = cluster.get_json("node", node)["metadata"].get("annotations", {}).get(REMEDIATION_ANNOTATION)
    return json.loads(text) if text else {}


def run_until(cluster: Cluster, done: Callable[[], bool], remediation_steps: list[dict[str, Any]],
              timeout: float = 60) -> None:  # fmt: skip
    async def run() -> None:
        config = Config.model_validate({"drain": {
            "enabled": True, "gate": {"min_schedulable_percent": 0},
            "remediation": {"enabled": True, "steps": remediation_steps}}})  # fmt: skip
        async with KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube:
            loop = DrainLoop(config, kube, instance="e2e-remediation")
            caches = [asyncio.ensure_future(i.run()) for i in loop.caches()]
            try:
                await loop.wait_ready()
                deadline = time.monotonic() + timeout
                while not await asyncio.to_thread(done):
                    assert time.monotonic() < deadline, "remediation did not reach the expected state"
                    await loop.run_once()
                    await asyncio.sleep(0.5)
            finally:
                for task in caches:
                    task.cancel()
                await asyncio.gather(*caches, return_exceptions=True)

    asyncio.run(run())


def test_steps_escalate_to_exhausted_each_with_its_outcome(cluster: Cluster, nodes: list[str]) -> None:
    quarantine(cluster, NODE, True)
    try:
        # Drained (nothing to move here), then handed to the first step: the GPUReset object is created.
        run_until(
            cluster, lambda: bool(cluster.kubectl("get", "gpureset", f"{NODE}-reset", check=False)), steps(60)
        )
        obj = cluster.get_json("gpureset", f"{NODE}-reset")
        assert obj["spec"] == {"node": NODE, "uuids": f"GPU-{SUFFIX}-1"}
        # The reset fails: its status condition says so; the next step (the reboot label) starts.
        status = {
            "status": {"conditions": [{"type": "Complete", "status": "False", "reason": "ResetFailed"}]}
        }
        cluster.kubectl("patch", "gpureset", f"{NODE}-reset", "--subresource=status", "--type=merge",
                        "-p", json.dumps(status))  # fmt: skip
        run_until(cluster, lambda: label(cluster, NODE, REBOOT_LABEL) == "true", steps(60))
        # Reboot times out (3 s): replace starts and the reboot label goes; replace times out: exhausted.
        run_until(cluster, lambda: state(cluster, NODE).get("final") == "exhausted", steps(60))
        st = state(cluster, NODE)
        assert [(h["name"], h["outcome"]) for h in st["history"]] == [
            ("gpu-reset", "failed"),
            ("reboot", "timed-out"),
            ("replace", "timed-out"),
        ]
        node = cluster.get_json("node", NODE)
        assert REBOOT_LABEL not in node["metadata"].get("labels", {})
        assert REPLACE_ANNOTATION not in node["metadata"].get("annotations", {})
        reasons = node_events(cluster, NODE)
        assert {
            "GPUDrainDone",
            "GPURemediationStarted",
            "GPURemediationEscalated",
            "GPURemediationExhausted",
        } <= set(reasons), reasons
    finally:
        quarantine(cluster, NODE, False)


def test_release_mid_step_succeeds_and_removes_the_marker(cluster: Cluster, nodes: list[str]) -> None:
    label_first = [{"name": "reboot", "action": "label", "key": REBOOT_LABEL, "timeout_seconds": 600}]
    quarantine(cluster, NODE2, True)
    try:
        run_until(cluster, lambda: label(cluster, NODE2, REBOOT_LABEL) == "true", label_first)
        quarantine(cluster, NODE2, False)  # the health controller released it (healthy period passed)
        run_until(cluster, lambda: not state(cluster, NODE2), label_first)
        assert REBOOT_LABEL not in cluster.get_json("node", NODE2)["metadata"].get("labels", {})
        reasons = node_events(cluster, NODE2)
        assert "GPURemediationSucceeded" in reasons, reasons
    finally:
        quarantine(cluster, NODE2, False)
