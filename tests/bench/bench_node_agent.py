"""Node agent benchmark: device-plugin call latency against the protocol's floor, and the reconcile pass.

Prints numbers, asserts nothing about time. Parts:

1. device-plugin calls over the kubelet's transport (gRPC on a unix socket), 2,000 of each, sequential as
   the kubelet makes them: `GetPreferredAllocation` (the admission guess over a node of 110 pods, 8 GPUs)
   and `Allocate`, served by the agent's `GpuDevicePlugin`, against a **null plugin** on the same transport
   that answers at once with empty responses (the floor of the protocol here). p50/p99 and the ratio.
2. reconcile: the pure `decide` over 110 pods with allocations, and a full pass with the PodResources
   `List` answered by a local gRPC server holding those 110 pods (the kubelet's answer shape): per pass and
   per pod event at 100 events/s (the agent reads at most every 0.2 s, so 100 events/s cost 5 reads/s).
3. the `gpuwarden node-agent` process idle: RSS (anonymous / file-backed) and CPU over 10 s, started as the
   chart starts it (`--config` with the chart's node-agent ConfigMap), with its topology read from a file
   and its API server unreachable (watch retries back off), which is the floor of what it costs on a node.

Run: `python -m tests.bench node_agent`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import grpc

from gpuwarden.litemetrics import Registry
from nodeagent.admission import Candidate, Preference, prefer
from nodeagent.deviceplugin import GpuDevicePlugin
from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from nodeagent.kubeletapi.podresources.v1 import api_pb2 as pr
from nodeagent.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from nodeagent.podresources import PodResourcesReader
from nodeagent.reconcile import Allocation, PodRecord, decide
from tests.bench.summary import record

CALLS = int(os.environ.get("GPUWARDEN_BENCH_DP_CALLS", "2000"))
PODS = 110
GPUS = [f"GPU-bench-{i}" for i in range(8)]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class NullPlugin(dp_grpc.DevicePluginServicer):
    """The floor: same service, same transport, no work."""

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return dp.PreferredAllocationResponse(
            container_responses=[
                dp.ContainerPreferredAllocationResponse() for _ in request.container_requests
            ]
        )

    async def Allocate(self, request: Any, context: Any) -> Any:
        return dp.AllocateResponse(
            container_responses=[dp.ContainerAllocateResponse() for _ in request.container_requests]
        )


def node_candidates() -> list[Candidate]:
    """110 pods bound to the node: 3 admitted 2-GPU pods, one pending 2-GPU pod, the rest CPU-only."""
    out = [Candidate("ns", f"running-{i}", f"2026-12-01T00:00:0{i}Z", (GPUS[2 * i], GPUS[2 * i + 1]), True)
           for i in range(3)]  # fmt: skip
    out.append(Candidate("ns", "pending", "2026-12-01T00:01:00Z", (GPUS[6], GPUS[7]), False))
    return out


async def serve(servicer: Any, sock: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    dp_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    return server


async def time_calls(sock: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"GetPreferredAllocation": [], "Allocate": []}
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        pref_req = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=GPUS[6:], allocation_size=2)
            ]
        )
        alloc_req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=GPUS[6:])])
        for _ in range(50):  # warm the channel
            await stub.GetPreferredAllocation(pref_req)
        for _ in range(CALLS):
            t0 = time.perf_counter()
            await stub.GetPreferredAllocation(pref_req)
            out["GetPreferredAllocation"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await stub.Allocate(alloc_req)
            out["Allocate"].append(time.perf_counter() - t0)
    return out


async def device_plugin_part(tmp: Path) -> None:
    cands = node_candidates()
    allocated = {c.key: c.recorded for c in cands if c.started}

    async def prefer_fn(available: Sequence[str], must: Sequence[str], size: int) -> Preference:
        return prefer(cands, allocated, available, must, size)

    plugin = GpuDevicePlugin(
        resource="nvidia.com/gpu", plugin_dir=tmp, socket_name="gw.sock", prefer=prefer_fn,
        visible_env="NVIDIA_VISIBLE_DEVICES", registry=Registry(),
    )  # fmt: skip
    await plugin.set_devices(dict.fromkeys(GPUS, True))
    ours = await serve(plugin, tmp / "gw.sock")
    null = await serve(NullPlugin(), tmp / "null.sock")
    try:
        gw = await time_calls(tmp / "gw.sock")
        floor = await time_calls(tmp / "null.sock")
    finally:
        await ours.stop(0)
        await null.stop(0)
    print(f"device-plugin calls over a unix socket, {CALLS} each, sequential (ms):")
    print(f"  {'call':24} {'gpuwarden p50':>14} {'p99':>8} {'null p50':>10} {'p99':>8} {'p99 ratio':>10}")
    for call in gw:
        g50, g99 = percentile(gw[call], 0.5) * 1e3, percentile(gw[call], 0.99) * 1e3
        n50, n99 = percentile(floor[call], 0.5) * 1e3, percentile(floor[call], 0.99) * 1e3
        print(f"  {call:24} {g50:14.3f} {g99:8.3f} {n50:10.3f} {n99:8.3f} {g99 / n99:9.2f}x")
        record(
            "node_agent",
            f"device plugin {call}, unix-socket gRPC: p99",
            g99,
            "ms",
            anchor="null device plugin, same transport",
            anchor_value=n99,
        )


class FakePodResources(pr_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources answer for a node of 110 pods (4 holding GPUs, one entry per device)."""

    def __init__(self) -> None:
        pods = []
        for i in range(PODS):
            devices = []
            if i < 4:
                devices = [
                    pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[g])
                    for g in GPUS[2 * i : 2 * i + 2]
                ]
            pods.append(
                pr.PodResources(
                    name=f"pod-{i}",
                    namespace="ns",
                    containers=[pr.ContainerResources(name="main", devices=devices)],
                )
            )
        self.answer = pr.ListPodResourcesResponse(pod_resources=pods)

    async def List(self, request: Any, context: Any) -> Any:
        return self.answer

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return pr.AllocatableResourcesResponse(
            devices=[pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=GPUS)]
        )


async def reconcile_part(tmp: Path) -> None:
    pods = [PodRecord("ns", f"pod-{i}", f"u{i}", (GPUS[2 * i], GPUS[2 * i + 1]) if i < 4 else None)
            for i in range(PODS)]  # fmt: skip
    allocs = [Allocation("ns", f"pod-{i}", (GPUS[2 * i + 1], GPUS[2 * i])) for i in range(4)]
    numa = {g: i // 4 for i, g in enumerate(GPUS)}
    runs = []
    for _ in range(2000):
        t0 = time.perf_counter()
        decide(pods, allocs, numa)
        runs.append(time.perf_counter() - t0)
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(FakePodResources(), server)  # type: ignore[no-untyped-call]
    sock = tmp / "pr.sock"
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    reader = PodResourcesReader(str(sock))
    passes = []
    cpu0 = time.process_time()
    try:
        for _ in range(500):
            t0 = time.perf_counter()
            got = await reader.allocations("nvidia.com/gpu")
            await reader.allocatable("nvidia.com/gpu")
            decide(pods, got, numa)
            passes.append(time.perf_counter() - t0)
    finally:
        cpu = time.process_time() - cpu0
        await reader.aclose()
        await server.stop(0)
    per_pass_cpu = cpu / len(passes)
    print(f"reconcile over {PODS} pods (4 with GPUs):")
    d50, d99 = statistics.median(runs) * 1e6, percentile(runs, 0.99) * 1e6
    print(f"  decide (pure):        p50 {d50:8.1f} us, p99 {d99:8.1f} us")
    print(f"  full pass (List + GetAllocatable + decide): p50 {statistics.median(passes) * 1e3:.3f} ms, "
          f"p99 {percentile(passes, 0.99) * 1e3:.3f} ms, CPU {per_pass_cpu * 1e3:.3f} ms")  # fmt: skip
    record(
        "node_agent",
        f"reconcile pass (List + GetAllocatable + decide), {PODS} pods: p99",
        percentile(passes, 0.99) * 1e3,
        "ms",
    )
    # 100 pod events/s: the loop reads at most every min_read_interval (0.2 s) -> 5 passes/s.
    per_second = 5 * per_pass_cpu
    print(f"  at 100 pod events/s: 5 passes/s = {per_second * 1e3:.2f} ms CPU per second "
          f"({per_second * 100:.2f} % of one core), 10 PodResources calls/s (kubelet limit 100)")  # fmt: skip


def process_idle(tmp: Path) -> None:
    topo = tmp / "topology.yaml"
    lines = [
        f'  - {{index: {i}, uuid: {g}, pciBusId: "0000:{0x10 + i:02x}:00.0", numa: {i // 4}}}\n'
        for i, g in enumerate(GPUS)
    ]
    topo.write_text("gpus:\n" + "".join(lines))
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    config = tmp / "config.yaml"  # deploy/overlays/node-agent/configmap.yaml, listen and dirs local
    config.write_text(
        "node_agent:\n  device_id_strategy: uuid\n  topology_source: auto\n"
        f"  kubelet_root_dir: /var/lib/kubelet\n  device_plugin_dir: {tmp}\n  listen: 127.0.0.1:0\n"
        "  device_plugin:\n    enabled: false\n"
        "logging:\n  format: json\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "node-agent", "--node-name", "bench", "--config", str(config),
         "--kubeconfig", str(kubeconfig), "--topology-file", str(topo), "--listen", "127.0.0.1:0",
         "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(4)
        stat0 = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        time.sleep(10)
        stat1 = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(stat1[11]) + int(stat1[12]) - int(stat0[11]) - int(stat0[12])) / ticks
        status = {
            line.split(":")[0]: int(line.split()[1]) / 1024
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:"))
        }
        rss = round(status["VmRSS"], 1)
        alive = proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"node-agent process idle (API unreachable, topology from a file): alive={alive}, RSS {rss} MiB "
          f"(anonymous {status['RssAnon']:.1f}, file-backed {status['RssFile']:.1f}), "
          f"CPU {cpu * 1000 / 10:.1f} ms/s over 10 s")  # fmt: skip
    record(
        "node_agent", "node-agent process idle: RSS", rss, "MiB", goal="≤ 40 MiB (issue 29)", met=rss <= 40
    )


async def amain() -> None:
    with tempfile.TemporaryDirectory(prefix="gwbench-", dir="/tmp") as d:
        tmp = Path(d)
        await device_plugin_part(tmp)
        await reconcile_part(tmp)
    with tempfile.TemporaryDirectory(prefix="gwbench-", dir="/tmp") as d:
        process_idle(Path(d))


def main() -> Awaitable[None]:
    return amain()
