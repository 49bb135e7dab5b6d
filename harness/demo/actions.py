"""Running the `do:` list of a scenario step against the live stack.

Why it exists: each action kind is one small, visible change to the world — apply a Deployment and its HPA,
change the QPS the simulator serves, inject a hardware fault, reboot a node, let a checkpointing job finish —
done through the same interfaces an operator or a real fault would use (the API server, the simulator's
control API). Each prints one timeline line saying what it did, so the terminal reads as a story.

What it must not do: check outcomes (that is `checks.py`) or wait for the cluster to react.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from gpuwarden.kube import PODS, KubeClient
from harness.demo import manifests
from harness.demo.checks import Checks
from harness.demo.observer import ClusterView, gpu_ids, is_bound
from harness.demo.scenario import Action, Deploy, Expect, Faults, Job
from harness.demo.stack import Stack
from harness.demo.timeline import Timeline


class ActionFailed(RuntimeError):
    """An action could not be carried out (the API server or the simulator refused it)."""


class Actions:
    """Carries out actions; `simulator` requests go to the stack's simulator control API."""

    def __init__(
        self, stack: Stack, view: ClusterView, kube: KubeClient, checks: Checks, timeline: Timeline
    ) -> None:
        self.stack = stack
        self.checks = checks
        self.view = view
        self.kube = kube
        self.t = timeline

    async def run(self, action: Action) -> None:
        handler = getattr(self, f"_{action.key}")
        try:
            await handler(getattr(action, action.key))
        except (httpx.HTTPError, RuntimeError) as exc:
            raise ActionFailed(f"{action.key}: {exc}") from exc

    async def _simulator(self, method: str, path: str, body: Any) -> Any:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
            response = await http.request(method, f"{self.stack.simulator_url}{path}", json=body)
        if response.status_code >= 400:
            raise ActionFailed(
                f"simulator {method} {path}: HTTP {response.status_code} {response.text.strip()}"
            )
        return response.json()

    async def _kubectl(self, *args: str) -> str:
        assert self.stack.cluster is not None
        return await asyncio.to_thread(self.stack.cluster.kubectl, *args)

    async def _apply(self, objects: list[dict[str, Any]]) -> None:
        assert self.stack.cluster is not None
        await asyncio.to_thread(self.stack.cluster.apply, *objects)

    @staticmethod
    def _where(w: Deploy | Job) -> str:
        parts = [f"{w.gpus} GPU{'s' if w.gpus > 1 else ''}/pod"]
        if w.priority_class:
            parts.append(f"priority {w.priority_class}")
        if w.pool:
            parts.append(f"pool {w.pool}")
        if w.nodes:
            parts.append(f"nodes {','.join(w.nodes)}")
        if w.hold:
            parts.append("finalizer: terminates slowly")
        return ", ".join(parts)

    async def _deploy(self, d: Deploy) -> None:
        await self._apply(manifests.workload_objects(d))
        replicas = f"{d.replicas} replica{'' if d.replicas == 1 else 's'}"
        text = f"Deployment {d.namespace}/{d.name}: {replicas}, {self._where(d)}"
        if d.hpa is not None:
            targets = [
                f"{n} {v:g}"
                for n, v in (
                    ("gpu_utilization", d.hpa.gpu_utilization),
                    ("requests_per_second", d.hpa.requests_per_second),
                )
                if v is not None
            ]
            targets += [f"{n} {v:g} (External)" for n, v in d.hpa.external_targets.items()]
            text += f"; HPA {d.hpa.min}-{d.hpa.max} on {' and '.join(targets)}"
        if d.qps is not None:
            body = {"namespace": d.namespace, "workload": d.name, "qps": d.qps, "qps_per_gpu": d.qps_per_gpu}
            if d.engine is not None:
                body["engine"] = d.engine
            await self._simulator("POST", "/control/load", body)
            text += f"; serving {d.qps:g} QPS ({d.qps_per_gpu:g} QPS per GPU at 100 %)"
            if d.engine is not None:
                text += f", a {d.engine} engine per pod behind a router"
        self.t.action(text)

    async def _job(self, j: Job) -> None:
        await self._apply(manifests.workload_objects(j))
        self.t.action(f"job {j.namespace}/{j.name}: {j.parallelism} worker pod(s), {self._where(j)}")

    async def _load(self, body: Any) -> None:
        await self._simulator("POST", "/control/load", body.model_dump())
        self.t.action(f"load on {body.namespace}/{body.workload} -> {body.qps:g} QPS")

    def _held_gpus(self, body: Faults) -> tuple[dict[str, list[int]], str]:
        """`gpus_of`: per node, the GPUs of the workload's first pod there (by name); and what that was."""
        assert body.gpus_of is not None
        sel = body.gpus_of
        chosen: dict[str, list[int]] = {}
        said = []
        for node in body.nodes:
            pods = sorted(
                (
                    p
                    for p in self.view.workload_pods(sel.namespace, sel.workload)
                    if is_bound(p) and p["spec"].get("nodeName") == node and gpu_ids(p)
                ),
                key=lambda p: str(p["metadata"]["name"]),
            )
            if not pods:
                raise ActionFailed(f"no pod of {sel.namespace}/{sel.workload} holds a GPU on {node}")
            chosen[node] = gpu_ids(pods[0])
            gpus = ",".join(map(str, chosen[node]))
            said.append(f"{node} GPU {gpus} (held by {pods[0]['metadata']['name']})")
        return chosen, "; ".join(said)

    async def _fault(self, body: Faults) -> None:
        held, where = self._held_gpus(body) if body.gpus_of is not None else ({}, "")
        faults = body.expand(held)
        await self._simulator("POST", "/control/faults", faults)
        extra = body.model_extra or {}
        what = " ".join(f"{k}={v}" for k, v in extra.items())
        gpus = f" x {len(body.gpus)} GPUs" if body.gpus else ""
        nodes = ", ".join(body.nodes) if len(body.nodes) <= 3 else f"{len(body.nodes)} nodes"
        self.t.action(f"fault injected: {what} on {where or nodes + gpus} ({len(faults)} fault(s))")

    async def _clear_faults(self, body: Any) -> None:
        result = await self._simulator("DELETE", "/control/faults", body.model_dump(exclude_none=True))
        self.t.action(f"faults cleared on {body.node or 'every node'} (reset={body.reset}): {result}")

    async def _reboot(self, body: Any) -> None:
        await self._simulator("DELETE", "/control/faults", {"node": body.node, "reset": True})
        await self.stack.patch_node_status(body.node, manifests.boot_id_patch())
        self.t.action(f"{body.node} rebooted: GPUs reset in the simulator, new status.nodeInfo.bootID")

    async def _release(self, body: Any) -> None:
        released = []
        for pod in self.view.workload_pods(body.namespace, body.workload):
            if manifests.HOLD_FINALIZER in (pod["metadata"].get("finalizers") or []):
                patch = {"metadata": {"finalizers": None}}
                await self.kube.patch(PODS, pod["metadata"]["name"], patch, namespace=body.namespace)
                released.append(pod["metadata"]["name"])
        self.t.action(f"{body.namespace}/{body.workload}: checkpoint done, finalizer removed from {released}")

    async def _delete(self, body: Any) -> None:
        ns = ["-n", body.namespace] if body.namespace else []
        await self._kubectl("delete", body.kind, body.name, *ns, "--wait=false", "--ignore-not-found")
        self.t.action(f"deleted {body.kind} {body.name}")

    async def _cordon(self, node: str) -> None:
        await self._kubectl("patch", "node", node, "-p", json.dumps({"spec": {"unschedulable": True}}))
        self.t.action(f"{node} cordoned")

    async def _sleep(self, seconds: float) -> None:
        self.t.action(f"waiting {seconds:g}s")
        await asyncio.sleep(seconds)

    async def _wait_for(self, expect: Expect) -> None:
        outcome = await self.checks.check(expect, expect.within or 60.0)
        if not outcome.passed:
            raise ActionFailed(f"gave up waiting for {outcome.expectation}")
