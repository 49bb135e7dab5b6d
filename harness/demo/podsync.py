"""Keep the fleet simulator's pod -> GPU mapping equal to what the cluster actually bound.

Why it exists: in a real cluster dcgm-exporter labels each GPU's series with the pod that holds it (from the
kubelet's pod-resources API), and the application's own `http_requests_total` comes from the pod. Here the
simulator plays both, so it must learn which pod holds which GPUs: the gpuwarden extender's bind records
them in the pod annotation `gpuwarden.io/gpu-ids`, and this loop PUTs the whole mapping of bound demo pods
to `/control/pods` whenever the watch cache changes. Thus when the HPA adds a replica, the new pod gets its
own DCGM series and a share of the QPS, per-pod utilization falls, and the loop the adapter serves closes.

What it must not do: invent placements. A pod without the annotation (not bound by our extender) is left out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gpuwarden.kube import JsonObject
from harness.demo.observer import ClusterView, gpu_ids, is_bound, workload_of
from harness.demo.timeline import Timeline


def mapping(pods: list[JsonObject]) -> list[dict[str, Any]]:
    """The `/control/pods` body entries for every bound pod that has its GPUs recorded, in a stable order."""
    out = []
    for pod in pods:
        ids = gpu_ids(pod)
        if not is_bound(pod) or not ids or not workload_of(pod):
            continue
        meta = pod["metadata"]
        out.append(
            {
                "namespace": meta["namespace"],
                "pod": meta["name"],
                "node": pod["spec"]["nodeName"],
                "gpus": ids,
                "workload": workload_of(pod),
            }
        )
    return sorted(out, key=lambda p: (p["namespace"], p["pod"]))


class PodSync:
    """Pushes `mapping(view.pods)` to the simulator after every change (coalesced, at most every 0.3 s)."""

    def __init__(self, view: ClusterView, simulator_url: str, timeline: Timeline) -> None:
        self.view = view
        self.url = f"{simulator_url}/control/pods"
        self.timeline = timeline
        self.last: list[dict[str, Any]] | None = None
        self.pushes = 0
        self.synced = asyncio.Event()

    async def run(self) -> None:
        await self.view.synced()
        warned = False
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:
            while True:
                self.view.changed.clear()
                body = mapping(self.view.pods.objects())
                if body != self.last:
                    try:
                        response = await http.put(self.url, json={"pods": body})
                        response.raise_for_status()
                        self.last = body
                        self.pushes += 1
                        warned = False
                    except httpx.HTTPError as exc:
                        if not warned:  # retried below; said once, not every 0.3 s
                            self.timeline.warn(f"pod -> GPU mapping not accepted by the simulator: {exc}")
                            warned = True
                        await asyncio.sleep(1.0)
                        continue
                self.synced.set()
                await self.view.changed.wait()
                await asyncio.sleep(0.3)
