"""What the demo sees of the cluster: watch caches of pods, nodes and HPAs, exported as gauges for Prometheus.

Why it exists: three parts of the demo need the same live view, and none may poll kubectl in a tight loop on
a 2-core machine. `ClusterView` keeps list+watch caches (gpuwarden.kube informers) of the demo's pods and of
all nodes, and polls HPAs once a second. From it:

* the checks read current state (replicas, taints, pod annotations);
* `podsync` maps bound pods to their GPUs in the simulator;
* `/metrics` here exports kube-state-metrics-like gauges (HPA replicas, metric values and targets, our
  taints, pod placements) that the demo's Prometheus scrapes, so the report's plots come from range queries
  over one time base, like the GPU metrics they are drawn against.

What it must not do: change the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuwarden.errors import KubeError
from gpuwarden.kube import NODES, PODS, Informer, JsonObject, KubeClient, Resource
from gpuwarden.selfmetrics import metrics_handler
from gpuwarden.wellknown import GPU_IDS
from gpuwarden.wellknown import NUMA_NODE as NUMA
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from harness.demo.manifests import APP_LABEL, DEMO_LABEL

HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", namespaced=True)


def quantity(value: Any) -> float:
    """A Kubernetes quantity string ("250m", "12", "1.5k") as a float; unknown suffixes give NaN."""
    text = str(value)
    for suffix, factor in (("m", 1e-3), ("k", 1e3), ("M", 1e6), ("G", 1e9)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    try:
        return float(text)
    except ValueError:
        return float("nan")


def workload_of(pod: JsonObject) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(APP_LABEL, ""))


def gpu_ids(pod: JsonObject) -> list[int]:
    raw = str(((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_IDS, ""))
    return [int(x) for x in raw.split(",") if x.strip().isdigit()]


def is_bound(pod: JsonObject) -> bool:
    """Bound to a node and holding its GPUs (a terminating pod still holds them until it is gone)."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def our_taint(node: JsonObject) -> JsonObject | None:
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == TAINT_KEY:
            return dict(taint)
    return None


class ClusterView:
    """Watch caches plus the latest HPA list; `run()` keeps them current until cancelled."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.pods = Informer(kube, PODS, label_selector=f"{DEMO_LABEL}=true")
        self.nodes = Informer(kube, NODES)
        self.hpas: list[JsonObject] = []
        self.changed = asyncio.Event()

    async def run(self) -> None:
        async def hpa_poll() -> None:
            while True:
                with contextlib.suppress(KubeError):
                    self.hpas = (await self.kube.list_objects(HPAS)).items
                await asyncio.sleep(1.0)

        def touched(_event: object) -> None:
            self.changed.set()

        await asyncio.gather(self.pods.run(touched), self.nodes.run(touched), hpa_poll())

    async def synced(self) -> None:
        await asyncio.wait_for(asyncio.gather(self.pods.synced.wait(), self.nodes.synced.wait()), 60)

    def workload_pods(self, namespace: str, workload: str) -> list[JsonObject]:
        return [
            p
            for p in self.pods.objects()
            if p["metadata"].get("namespace") == namespace and workload_of(p) == workload
        ]

    def node(self, name: str) -> JsonObject | None:
        return self.nodes.get(name)

    def hpa(self, namespace: str, name: str) -> JsonObject | None:
        return next(
            (
                h
                for h in self.hpas
                if h["metadata"].get("namespace") == namespace and h["metadata"].get("name") == name
            ),
            None,
        )


METRIC_SOURCES = {"Pods": "pods", "External": "external"}
"""HPA metric types the demo plots, and the key of their block in spec.metrics / status.currentMetrics."""


def _metric_blocks(metrics: list[JsonObject]) -> Iterator[tuple[str, JsonObject]]:
    for m in metrics:
        block = m.get(METRIC_SOURCES.get(str(m.get("type")), ""))
        if isinstance(block, dict):
            yield str(block["metric"]["name"]), block


def hpa_metric_values(hpa: JsonObject) -> dict[str, tuple[float, float]]:
    """Metric name -> (current average value, target average value) from an HPA's spec and status, for its
    Pods and External metrics.

    An External average over zero replicas is a division by zero in the HPA controller, which reports it as
    a huge negative number; a negative current value is therefore NaN (no reading), as is a missing one.
    """
    targets = {
        name: quantity(block["target"].get("averageValue"))
        for name, block in _metric_blocks((hpa.get("spec") or {}).get("metrics") or [])
    }
    current = {
        name: value
        if (value := quantity((block.get("current") or {}).get("averageValue"))) >= 0
        else math.nan
        for name, block in _metric_blocks((hpa.get("status") or {}).get("currentMetrics") or [])
    }
    return {name: (current.get(name, math.nan), target) for name, target in targets.items()}


class ViewCollector(Collector):
    """Gauges computed on scrape from the view (so vanished pods and taints vanish from Prometheus)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        replicas = GaugeMetricFamily(
            "gpuwarden_demo_hpa_replicas",
            "HPA replicas (desired, current)",
            labels=["namespace", "hpa", "kind"],
        )
        metric = GaugeMetricFamily(
            "gpuwarden_demo_hpa_metric",
            "HPA metric average, Pods or External (current, target), as the HPA controller sees it",
            labels=["namespace", "hpa", "metric", "kind"],
        )
        for h in self.view.hpas:
            ns, name = h["metadata"]["namespace"], h["metadata"]["name"]
            status = h.get("status") or {}
            for kind in ("desired", "current"):
                replicas.add_metric([ns, name, kind], float(status.get(f"{kind}Replicas", 0)))
            for metric_name, (current, target) in hpa_metric_values(h).items():
                metric.add_metric([ns, name, metric_name, "current"], current)
                metric.add_metric([ns, name, metric_name, "target"], target)
        taints = GaugeMetricFamily(
            "gpuwarden_demo_node_quarantined", "1 while the node carries our taint", labels=["node", "reason"]
        )
        for node in self.view.nodes.objects():
            taint = our_taint(node)
            if taint is not None:
                taints.add_metric([node["metadata"]["name"], str(taint.get("value", ""))], 1.0)
        bound = GaugeMetricFamily(
            "gpuwarden_demo_pod_bound",
            "1 while a demo pod is bound to a node",
            labels=["namespace", "workload", "pod", "node", "gpus", "numa", "terminating"],
        )
        nominated = GaugeMetricFamily(
            "gpuwarden_demo_pod_nominated",
            "1 while a pending demo pod carries status.nominatedNodeName",
            labels=["namespace", "workload", "pod", "node"],
        )
        for pod in self.view.pods.objects():
            meta = pod["metadata"]
            annotations = meta.get("annotations") or {}
            if is_bound(pod):
                labels = [
                    meta["namespace"],
                    workload_of(pod),
                    meta["name"],
                    pod["spec"]["nodeName"],
                    annotations.get(GPU_IDS, ""),
                    annotations.get(NUMA, ""),
                    str(bool(meta.get("deletionTimestamp"))).lower(),
                ]
                bound.add_metric(labels, 1.0)
            elif nominee := (pod.get("status") or {}).get("nominatedNodeName"):
                nominated.add_metric([meta["namespace"], workload_of(pod), meta["name"], nominee], 1.0)
        yield from (replicas, metric, taints, bound, nominated)


async def serve_metrics(view: ClusterView, port: int) -> web.AppRunner:
    """Serve the view's gauges on 127.0.0.1:`port`/metrics for the demo's Prometheus."""
    registry = CollectorRegistry()
    registry.register(ViewCollector(view))
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(registry))  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
