"""The extender under overload with the real kube-scheduler (issue 47): a bind held past the scheduler's
httpTimeout, and the Events of a 1,000-pod burst.

* A bind held past its deadline: the scheduler calls our bind with `httpTimeout: 2s`; the extender reaches
  the API server through a TCP proxy that holds each request it forwards for 2.5 s while slowed (a slowed
  API server, as the extender sees it). The claim protocol's claim PATCH returns after the deadline, so the
  bind is cancelled before its Binding and withdraws the claim; the proxy is made fast again and the
  scheduler's retry binds the pod, once.
* A 1,000-pod burst on a private pool of 20 nodes x 64 GPUs, the extender's API requests held 50 ms each by
  the proxy (its one Events writer then falls behind the binds, as under load): every bind is accounted for
  by the extender's GPUsAssigned Events - the pod's own, or its count in its node's summary - and none is
  dropped.

The extender runs in this process (`RunningExtender`), as the other extender e2e tests run it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, poll
from tests.e2e.conftest import free_port, gpuwarden_extender, pod_manifest, scheduler_calling
from tests.e2e.test_extender_scheduler import PREFIX, RunningExtender

pytestmark = pytest.mark.e2e

SUFFIX = uuid.uuid4().hex[:5]
POOL = f"ovl-{SUFFIX}"
SLOW = [f"ovl-{SUFFIX}-slow"]
BURST = [f"ovl-{SUFFIX}-{i:02d}" for i in range(20)]
BURST_PODS = 1000
HTTP_TIMEOUT = 2.0
HOLD = 2.5
"""Seconds the slowed proxy holds each request: past the bind's deadline (90 % of the 2 s httpTimeout)."""


def topology(numa: int, per_numa: int) -> dict[str, Any]:
    return {
        str(i): {"numa": i // per_numa, "pcie": f"pci{i // 2}", "nvlink": f"nvl{i // 2}", "uuid": f"GPU-{i}"}
        for i in range(numa * per_numa)
    }


class SlowProxy:
    """A TCP proxy to the API server on its own thread and loop; while `hold` > 0 every chunk the client
    sends waits that long before it is forwarded (TLS passes through untouched)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.hold = 0.0
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="slow-proxy", daemon=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slowed: bool) -> None:
        try:
            while chunk := await reader.read(1 << 16):
                if slowed and self.hold > 0:
                    await asyncio.sleep(self.hold)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer, True), self._pump(up_reader, writer, False))

    def start(self) -> SlowProxy:
        self.thread.start()

        async def listen() -> None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

        asyncio.run_coroutine_threadsafe(listen(), self.loop).result(timeout=10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def kubeconfig(self, cluster: Cluster, where: Path) -> Path:
        """The cluster's kubeconfig pointed at this proxy (the API server's certificate is for 127.0.0.1)."""
        doc = yaml.safe_load(cluster.kubeconfig.read_text())
        for entry in doc["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path = where / "kubeconfig-slow.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path


@pytest.fixture(scope="module")
def pool(cluster: Cluster) -> Iterator[list[str]]:
    taint = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
    labels = {"gpuwarden.io/e2e-pool": POOL}
    specs = [
        GpuNodeSpec(name=n, gpus=8, labels={**labels, "burst": "0"}, topology=topology(2, 4), taints=[taint])
        for n in SLOW
    ]
    specs += [
        GpuNodeSpec(
            name=n, gpus=64, labels={**labels, "burst": "1"}, topology=topology(2, 32), taints=[taint]
        )
        for n in BURST
    ]
    names = add_gpu_nodes(cluster, specs)
    try:
        yield names
    finally:
        delete_nodes(cluster, names)


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[SlowProxy]:
    host, _, api_port = cluster.server.removeprefix("https://").partition(":")
    started = SlowProxy((host, int(api_port))).start()
    try:
        yield started
    finally:
        started.stop()


def gpu_pod(namespace: str, name: str, gpus: int, selector: dict[str, str]) -> dict[str, Any]:
    pod = pod_manifest(name, gpus=gpus)
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["nodeSelector"] = selector
    pod["spec"]["tolerations"] = [{"key": "gpuwarden.io/e2e-pool", "operator": "Equal", "value": POOL}]
    return pod


def bound(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = cluster.get_json("pods", "-n", namespace)["items"]
    return {p["metadata"]["name"]: p for p in items if p["spec"].get("nodeName")}


def test_a_bind_held_past_the_deadline_is_cancelled_and_the_pod_bound_once_on_the_retry(
    cluster: Cluster, namespace: str, pool: list[str], proxy: SlowProxy, tmp_path: Path
) -> None:
    port = free_port()
    spec = dataclasses.replace(gpuwarden_extender(port, PREFIX), http_timeout=f"{HTTP_TIMEOUT:g}s")
    with scheduler_calling(cluster, spec):
        section = {"bind_protocol": "claim", "scheduler_http_timeout_seconds": HTTP_TIMEOUT}
        slowed = proxy.kubeconfig(cluster, tmp_path)
        running = RunningExtender(cluster, port, section=section, kubeconfig=slowed).start()
        try:
            proxy.hold = HOLD  # the API server slows down after the extender synced
            cluster.apply(gpu_pod(namespace, "held", 4, {"gpuwarden.io/e2e-pool": POOL, "burst": "0"}))

            def cancelled() -> bool:
                labels = {"action": "cancelled"}
                return running.counter("gpuwarden_extender_bind_overload_total", labels) >= 1

            poll(cancelled, timeout=60, what="a bind cancelled past its deadline")
            proxy.hold = 0.0  # the API server recovers; the scheduler retries the pod
            poll(lambda: "held" in bound(cluster, namespace), timeout=90, what="the pod bound")
            pod = bound(cluster, namespace)["held"]
            annotations = pod["metadata"]["annotations"]
            ids = annotations["gpuwarden.io/gpu-ids"].split(",")
            assert pod["spec"]["nodeName"] == SLOW[0] and len(ids) == 4, pod["metadata"]
            assert annotations["gpuwarden.io/numa-node"] in ("0", "1"), annotations
            posted = running.counter("gpuwarden_extender_bind_phase_seconds_count", {"phase": "binding"})
            assert posted == 1, f"{posted} Bindings posted for one pod"
            ok = running.counter("gpuwarden_extender_requests_total", {"verb": "bind", "outcome": "ok"})
            errors = running.counter(
                "gpuwarden_extender_requests_total", {"verb": "bind", "outcome": "error"}
            )
            assert ok >= 1 and errors >= 1, (ok, errors)  # the cancelled try answered Error, then bound
        finally:
            running.stop()


SUMMARY = re.compile(r"^GPUsAssigned for (\d+) pods on node (\S+) ")


def test_events_after_a_1000_pod_burst_account_for_every_bind(
    cluster: Cluster, namespace: str, pool: list[str], proxy: SlowProxy, tmp_path: Path
) -> None:
    port = free_port()
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    slowed = proxy.kubeconfig(cluster, tmp_path)
    with scheduler_calling(cluster, gpuwarden_extender(port, PREFIX)):
        running = RunningExtender(
            cluster, port, section={"bind_protocol": "leader"}, kubeconfig=slowed
        ).start()
        proxy.hold = 0.05
        try:
            selector = {"gpuwarden.io/e2e-pool": POOL, "burst": "1"}
            pods = [gpu_pod(namespace, f"b{i:04d}", 1, selector) for i in range(BURST_PODS)]
            for start in range(0, BURST_PODS, 250):
                doc = {"apiVersion": "v1", "kind": "List", "items": pods[start : start + 250]}
                cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(doc), timeout=120)
            poll(
                lambda: len(bound(cluster, namespace)) == BURST_PODS, timeout=600, interval=2.0,
                what=f"{BURST_PODS} pods bound",
            )  # fmt: skip
            binds = sum(
                sample.value
                for family in running.registry.collect()
                if family.name == "gpuwarden_extender_placements"
                for sample in family.samples
                if sample.name.endswith("_total")
            )
            assert binds == BURST_PODS, binds  # every pod was bound by the extender, once

            def accounted() -> tuple[int, int] | None:
                items = cluster.get_json("events.v1.events.k8s.io", "-n", namespace)["items"]
                own = {
                    e["regarding"]["name"]
                    for e in items
                    if e.get("reason") == "GPUsAssigned"
                    and e.get("reportingController") == "gpuwarden.io/extender"
                }
                summarized = 0
                for e in cluster.get_json("events.v1.events.k8s.io", "-n", "default")["items"]:
                    match = SUMMARY.match(str(e.get("note", "")))
                    mine = match is not None and match.group(2) in BURST
                    if mine and e.get("action") == "BindSummary" and str(e.get("eventTime") or "") >= since:
                        assert match is not None
                        summarized += int(match.group(1))
                return (len(own), summarized) if len(own) + summarized >= BURST_PODS else None

            own, summarized = poll(accounted, timeout=60, interval=2.0, what="Events for every bind")
            assert own + summarized == BURST_PODS, (own, summarized)
            assert running.counter("gpuwarden_extender_events_dropped_total", {}) == 0
            assert running.counter("gpuwarden_extender_events_summarized_total", {}) == summarized
            print(f"1,000-pod burst: {own} GPUsAssigned Events per pod, {summarized} pods in node summaries")
        finally:
            running.stop()
