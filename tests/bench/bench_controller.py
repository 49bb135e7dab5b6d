"""Controller benchmark: the whole `gpuwarden controller` process on a 5,000-node GPU fleet - its memory.

Prints numbers, asserts nothing about time. One real control plane from the test bed (kube-apiserver, etcd,
kube-controller-manager, kube-scheduler, kwok), 5,000 kwok GPU nodes (8 GPUs, 2 NUMA x 4, with the topology
annotation) and 2,000 GPU pods the default scheduler placed on them. Then `gpuwarden controller --config`
as the chart runs it, with every loop on: health quarantine, drain, idle GPUs (dry-run), nomination
cleanup, the preemption throttle and the extender (served, not called). Prometheus is a real, empty one:
the loops query it each pass and find no series, so what is measured is the process and its one node/pod
informer (`controller/gpus/feed.py`) holding the fleet, not health state.

Measured while it runs its loops for `GPUWARDEN_BENCH_CONTROLLER_SECONDS` (default 30) after `/readyz`:
RSS (steady, sampled every second), its peak (VmHWM), CPU cores, and the time to ready (lists + warm-up).
The anchor is kube-scheduler in the same run: the Go component whose informers hold the same nodes and pods
(and more), the process a platform team compares a scheduling-side controller with.

Run: `python -m tests.bench controller` (GPUWARDEN_BENCH_CONTROLLER_NODES / _PODS to resize).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuwarden import ports
from harness.localprom import LocalPrometheus
from harness.testbed import (
    Binaries,
    Cluster,
    ClusterConfig,
    GpuNodeSpec,
    TestbedMissingError,
    ensure_namespace,
)
from harness.testbed.cluster import process_memory
from harness.testbed.fleet import create_fleet, quiet_fleet_config
from tests.bench.scheduler_e2e import cpu_seconds, create_pods, topology, wait_quiet
from tests.bench.summary import record

NODES = int(os.environ.get("GPUWARDEN_BENCH_CONTROLLER_NODES", "5000"))
PODS = int(os.environ.get("GPUWARDEN_BENCH_CONTROLLER_PODS", "2000"))
SECONDS = float(os.environ.get("GPUWARDEN_BENCH_CONTROLLER_SECONDS", "30"))
NAMESPACE = "gpuwarden"
PODS_NAMESPACE = "bench-controller"


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def controller_config(kubeconfig: Path, prometheus_url: str, port: int) -> dict[str, Any]:
    """Production defaults with every loop on (idle in dry-run) and the extender served on `port`."""
    return {
        "prometheus": {"url": prometheus_url},
        "kubernetes": {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE},
        "drain": {"enabled": True},
        "idle": {"enabled": True, "dry_run": True},
        "extender": {"bind_address": "127.0.0.1", "port": port},
        "logging": {"format": "json"},
    }


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until `url` answers 200; raises when the process died or the time ran out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"gpuwarden controller exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"gpuwarden controller not ready at {url} after {timeout:.0f} s")


def scheduled(cluster: Cluster, namespace: str) -> int:
    """How many pods of `namespace` have a node."""
    out = cluster.kubectl(
        "get", "pods", "-n", namespace, "-o", "jsonpath={range .items[*]}{.spec.nodeName}{'\\n'}{end}",
        timeout=120,
    )  # fmt: skip
    return sum(1 for line in out.splitlines() if line.strip())


def fleet(cluster: Cluster) -> None:
    specs = [GpuNodeSpec(name=f"bench-{i:05d}", gpus=8, topology=topology(2, 4)) for i in range(NODES)]
    took = create_fleet(cluster, specs)
    print(f"  {NODES} kwok GPU nodes (8 GPUs, 2 NUMA x 4) Ready in {took:.0f} s", flush=True)
    ensure_namespace(cluster, PODS_NAMESPACE)
    ensure_namespace(cluster, NAMESPACE)
    took = create_pods(cluster, PODS_NAMESPACE, PODS, timeout=max(300.0, PODS * 0.3))
    started = time.monotonic()
    while (done := scheduled(cluster, PODS_NAMESPACE)) < PODS and time.monotonic() - started < 600:
        time.sleep(2)
    print(
        f"  {PODS} GPU pods created in {took:.0f} s, {done} placed by the default scheduler "
        f"{time.monotonic() - started:.0f} s later",
        flush=True,
    )
    wait_quiet(cluster)


def measure(cluster: Cluster, prometheus_url: str, workdir: Path) -> None:
    port = ports.free_port("127.0.0.1")
    path = workdir / "controller.yaml"
    path.write_text(yaml.safe_dump(controller_config(cluster.kubeconfig, prometheus_url, port)))
    with (workdir / "controller.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "controller", "--config", str(path)],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}/readyz", proc, 600)
        cpu0, samples = cpu_seconds(proc.pid), []
        started = time.monotonic()
        while time.monotonic() - started < SECONDS:
            time.sleep(1)
            samples.append(process_memory(proc.pid, "VmRSS"))
        cores = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - started)
        if proc.poll() is not None:
            raise RuntimeError(f"gpuwarden controller exited with {proc.returncode} while measured")
        steady = statistics.median(samples)
        peak, anon = process_memory(proc.pid, "VmHWM"), process_memory(proc.pid, "RssAnon")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    plane = cluster.control_plane_rss()
    sched, kcm = plane.get("kube-scheduler", 0), plane.get("kube-controller-manager", 0)
    print(
        f"  gpuwarden controller (all loops, {NODES} nodes, {PODS} GPU pods): ready in {ready:.1f} s; "
        f"RSS {mib(steady)} median over {len(samples)} s (anonymous {mib(anon)}), peak {mib(peak)}; "
        f"CPU {cores:.3f} cores while idle-looping",
        flush=True,
    )
    print(
        f"  same run: kube-scheduler RSS {mib(sched)}, kube-controller-manager RSS {mib(kcm)}; "
        f"controller / kube-scheduler {steady / sched:.2f}x"
        if sched
        else "  kube-scheduler not running",
        flush=True,
    )
    fleet_text = f"{NODES:,} kwok nodes + {PODS:,} GPU pods, every loop on"
    record(
        "controller", f"RSS, {fleet_text}", steady / 2**20, "MiB",
        anchor="kube-scheduler (same fleet, same run)", anchor_value=sched / 2**20 if sched else None,
        goal="reported (issue 29)",
    )  # fmt: skip
    record("controller", f"peak RSS (VmHWM), {fleet_text}", peak / 2**20, "MiB")
    record("controller", f"time to ready (lists + warm-up), {fleet_text}", ready, "s")


async def run() -> None:
    wall = time.perf_counter()
    try:
        Binaries.locate()
    except TestbedMissingError as exc:
        print(f"  controller at {NODES} nodes: skipped, {exc}")
        return
    config = quiet_fleet_config(
        ClusterConfig(name=f"gw-ctl-{os.getpid()}", progress=False, ready_timeout=300)
    )
    cluster = await asyncio.to_thread(Cluster.create, config)
    try:
        with tempfile.TemporaryDirectory(prefix="gw-bench-ctl-") as tmp:
            prom = LocalPrometheus(Path(tmp) / "prom", [])
            await prom.start()
            try:
                await asyncio.to_thread(fleet, cluster)
                await asyncio.to_thread(measure, cluster, prom.url, Path(tmp))
            finally:
                await prom.stop()
    finally:
        await asyncio.to_thread(cluster.delete)
    print(f"  bench_controller wall time {time.perf_counter() - wall:.0f} s", flush=True)


def main() -> Any:
    return run()
