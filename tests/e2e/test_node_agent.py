"""`gpuwarden node-agent` on the real kubelet node, with the real kube-scheduler calling our extender.

Enforce mode: the agent (a real `gpuwarden node-agent --device-plugin` process) publishes the node's topology
from a file (this machine has no GPU), registers as the kubelet's device plugin for `nvidia.com/gpu`, and a
2-GPU and a 4-GPU pod placed by kube-scheduler + our extender see, inside the container, exactly the GPU UUIDs
the extender recorded. Observe mode: beside a device plugin that always prefers the highest free ids (as a
stock plugin may), the agent records the GPUs each container actually got, counts and events the override,
and the extender's next choice accounts for the actual GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_REQUESTED as REQUESTED_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_SOURCE as SOURCE_ANNOTATION
from harness.testbed import Cluster, ExtenderSpec, SchedulerSettings, poll, scheduler_configuration
from harness.testbed.realnode import KUBELET_SOCKET, RealNode
from tests.e2e.conftest import REAL_NODE, free_port
from tests.e2e.minimal_device_plugin import MinimalDevicePlugin
from tests.e2e.test_extender_scheduler import PREFIX, RunningExtender
from tests.e2e.test_kubelet_node import create, events, tool_pod, wait_phase

pytestmark = pytest.mark.e2e
GPU = "nvidia.com/gpu"
UUIDS = [f"GPU-e2e0000-0000-0000-0000-00000000000{i}" for i in range(8)]


def topology_file(path: Path) -> Path:
    """8 GPUs: 2 NUMA nodes x 4, a PCIe switch per pair, NVLink within each NUMA node."""
    gpus = []
    for i, uuid in enumerate(UUIDS):
        peers = [f"0000:{0x10 + j:02x}:00.0" for j in range(8) if j // 4 == i // 4 and j != i]
        gpus.append(
            {
                "index": i,
                "uuid": uuid,
                "pciBusId": f"0000:{0x10 + i:02x}:00.0",
                "numa": i // 4,
                "pcieSwitch": f"sw{i // 2}",
                "nvlinkPeers": peers,
            }
        )
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return path


class Agent:
    """A `gpuwarden node-agent` process for the real node, with its logs kept."""

    def __init__(self, cluster: Cluster, node: RealNode, workdir: Path, *, device_plugin: bool) -> None:
        self.port = free_port()
        config = {
            "node_agent": {
                "kubelet_root_dir": str(node.kubelet_root),
                "device_plugin_dir": str(node.device_plugin_dir),
                "reconcile_interval_seconds": 1,
                "topology_interval_seconds": 5,
            },
            "logging": {"format": "json", "level": "info"},
        }
        cfg = workdir / f"agent-{self.port}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        self.log = workdir / f"agent-{self.port}.log"
        cmd = [
            sys.executable, "-m", "gpuwarden", "node-agent", "--config", str(cfg),
            "--kubeconfig", str(cluster.kubeconfig), "--node-name", node.name,
            "--topology-file", str(topology_file(workdir / "topology.yaml")),
            "--listen", f"127.0.0.1:{self.port}",
            *(["--device-plugin"] if device_plugin else []),
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        poll(self.ready, timeout=60, what=f"node agent /readyz (log {self.log})")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"node agent exited rc={self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def metric(self, name: str, labels: str = "") -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(f"{name}{{{labels}}}" if labels else f"{name} "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def extender_on_node_cluster(node_cluster: Cluster) -> Iterator[RunningExtender]:
    """Our extender (in-process) as binder for nvidia.com/gpu pods of the node cluster's kube-scheduler."""
    port = free_port()
    running = RunningExtender(node_cluster, port).start()
    original = yaml.safe_load(Path(node_cluster.scheduler_config_path()).read_text())
    spec = ExtenderSpec(
        url_prefix=f"http://127.0.0.1:{port}{PREFIX}",
        filter_verb="filter",
        prioritize_verb="prioritize",
        bind_verb="bind",
        weight=12,
        node_cache_capable=True,
        ignorable=False,
        managed_resources=[GPU],
    )
    node_cluster.restart_scheduler(scheduler_configuration(SchedulerSettings(extenders=[spec])))
    try:
        yield running
    finally:
        node_cluster.restart_scheduler(original)
        running.stop()


def annotations(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    return dict(cluster.get_json("pod", name, "-n", ns)["metadata"].get("annotations") or {})


def visible_devices(cluster: Cluster, ns: str, name: str) -> list[str]:
    def seen() -> str | None:
        out = cluster.kubectl("logs", name, "-n", ns, check=False)
        for _, text in events(out):
            if text.startswith("env NVIDIA_VISIBLE_DEVICES="):
                return text.split("=", 1)[1]
        return None

    return poll(seen, timeout=30, what=f"{name}'s NVIDIA_VISIBLE_DEVICES").split(",")


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return tool_pod(name, ["--env", "NVIDIA_VISIBLE_DEVICES", "--sleep", "0"], gpus=gpus)


def wait_allocatable(cluster: Cluster, count: int) -> None:
    poll(
        lambda: cluster.get_json("node", REAL_NODE)["status"].get("allocatable", {}).get(GPU) == str(count),
        timeout=90,
        what=f"{GPU}={count} allocatable on {REAL_NODE}",
    )


def test_enforce_mode_hands_the_container_exactly_the_recorded_gpus(
    node_cluster: Cluster, real_node: RealNode, extender_on_node_cluster: RunningExtender, node_ns: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    agent = Agent(node_cluster, real_node, tmp_path, device_plugin=True)
    try:
        wait_allocatable(node_cluster, 8)
        node = node_cluster.get_json("node", REAL_NODE)
        published = json.loads(node["metadata"]["annotations"]["gpuwarden.io/gpu-topology"])
        assert sorted(published) == sorted(UUIDS)  # ids are the device plugin's ids (uuid strategy)
        assert {published[u]["numa"] for u in UUIDS[:4]} == {0}
        create(node_cluster, node_ns, gpu_pod("two", 2), gpu_pod("four", 4))
        for name, size in (("two", 2), ("four", 4)):
            wait_phase(node_cluster, node_ns, name, "Running")
            seen = visible_devices(node_cluster, node_ns, name)
            ann = poll(
                lambda n=name: (
                    (a := annotations(node_cluster, node_ns, n)).get(SOURCE_ANNOTATION) == "kubelet" and a
                ),
                timeout=30,
                what=f"{name} reconciled by the agent",
            )
            recorded = ann[GPU_IDS_ANNOTATION].split(",")
            assert len(recorded) == size
            assert sorted(seen) == sorted(recorded), (name, seen, ann)
            assert REQUESTED_ANNOTATION not in ann  # honoured: nothing was overridden
        four = annotations(node_cluster, node_ns, "four")[GPU_IDS_ANNOTATION].split(",")
        assert {published[u]["numa"] for u in four} in ({0}, {1})  # the extender's single-NUMA choice held
        assert agent.metric("gpuwarden_node_assignments_total", 'outcome="honoured"') >= 2
        assert agent.metric("gpuwarden_node_assignments_total", 'outcome="overridden"') == 0
    finally:
        node_cluster.kubectl(
            "delete", "pods", "--all", "-n", node_ns, "--grace-period=0", "--force", check=False
        )
        agent.stop()


class HighestFirstPlugin(MinimalDevicePlugin):
    """A device plugin that prefers the highest free ids, whatever the scheduler recorded."""

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp

        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp

        out = []
        for creq in request.container_requests:
            ids = sorted(creq.available_deviceIDs, reverse=True)[: creq.allocation_size]
            out.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=out)


def test_observe_mode_records_the_kubelets_choice_and_the_extender_follows_it(
    node_cluster: Cluster, real_node: RealNode, extender_on_node_cluster: RunningExtender, node_ns: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    plugin = HighestFirstPlugin(resource=GPU, devices=UUIDS, plugin_dir=real_node.device_plugin_dir)
    plugin.start(KUBELET_SOCKET)
    agent = Agent(node_cluster, real_node, tmp_path, device_plugin=False)
    try:
        wait_allocatable(node_cluster, 8)
        poll(
            lambda: (
                "gpuwarden.io/gpu-topology"
                in node_cluster.get_json("node", REAL_NODE)["metadata"]["annotations"]
            ),
            timeout=30,
            what="topology published",
        )
        create(node_cluster, node_ns, gpu_pod("first", 2))
        wait_phase(node_cluster, node_ns, "first", "Running")
        seen = visible_devices(node_cluster, node_ns, "first")
        assert sorted(seen) == sorted(UUIDS[-2:])  # the plugin's (kubelet's) choice: the highest two
        ann = poll(
            lambda: (
                (a := annotations(node_cluster, node_ns, "first")).get(SOURCE_ANNOTATION) == "kubelet" and a
            ),
            timeout=30,
            what="first reconciled by the agent",
        )
        # The extender recorded another pair; the agent wrote the actual one where the extender reads it.
        assert sorted(ann[GPU_IDS_ANNOTATION].split(",")) == sorted(seen)
        assert sorted(ann[REQUESTED_ANNOTATION].split(",")) != sorted(seen)
        assert agent.metric("gpuwarden_node_assignments_total", 'outcome="overridden"') >= 1
        reasons = node_cluster.kubectl(
            "get", "events", "-n", node_ns, "--field-selector", "involvedObject.name=first",
            "-o", "jsonpath={.items[*].reason}",
        )  # fmt: skip
        assert "GPUAssignmentOverridden" in reasons.split()
        # The extender now counts the actual GPUs as taken: the next pair it records avoids them.
        create(node_cluster, node_ns, gpu_pod("second", 2))
        wait_phase(node_cluster, node_ns, "second", "Running")
        recorded_second = poll(
            lambda: (
                (a := annotations(node_cluster, node_ns, "second")).get(REQUESTED_ANNOTATION)
                or (a.get(SOURCE_ANNOTATION) == "kubelet" and a.get(GPU_IDS_ANNOTATION))
            ),
            timeout=30,
            what="second reconciled",
        ).split(",")
        assert not set(recorded_second) & set(seen), (recorded_second, seen)
    finally:
        node_cluster.kubectl(
            "delete", "pods", "--all", "-n", node_ns, "--grace-period=0", "--force", check=False
        )
        agent.stop()
        plugin.stop()


def test_enforce_mode_survives_a_kubelet_restart_and_drops_a_quarantined_gpu(
    node_cluster: Cluster, real_node: RealNode, extender_on_node_cluster: RunningExtender, node_ns: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    agent = Agent(node_cluster, real_node, tmp_path, device_plugin=True)
    record = {
        "version": 1, "state": "quarantined", "reason": "xid-79",
        "evidence": [{"reason": "xid-79", "gpu": UUIDS[0], "xid": 79}],
    }  # fmt: skip
    try:
        wait_allocatable(node_cluster, 8)
        assert agent.metric("gpuwarden_node_device_plugin_registrations_total", 'outcome="ok"') == 1
        # The kubelet restarts and wipes its device-plugin directory: the agent serves a new socket and
        # registers again, and new pods still get their recorded sets.
        real_node.restart_kubelet()
        poll(
            lambda: agent.metric("gpuwarden_node_device_plugin_registrations_total", 'outcome="ok"') >= 2,
            timeout=60,
            what="the agent re-registered after the kubelet restart",
        )
        wait_allocatable(node_cluster, 8)
        create(node_cluster, node_ns, gpu_pod("after-restart", 2))
        wait_phase(node_cluster, node_ns, "after-restart", "Running")
        seen = visible_devices(node_cluster, node_ns, "after-restart")
        ann = poll(
            lambda: (
                (a := annotations(node_cluster, node_ns, "after-restart")).get(SOURCE_ANNOTATION) == "kubelet"
                and a
            ),
            timeout=30,
            what="after-restart reconciled",
        )
        assert sorted(seen) == sorted(ann[GPU_IDS_ANNOTATION].split(",")) and REQUESTED_ANNOTATION not in ann
        # A record without our taint quarantines nothing (the one rule, gpuwarden.quarantine): the agent
        # reads the node (its devices refreshed on every node event) and keeps all 8 devices Healthy.
        patch = {"metadata": {"annotations": {"gpuwarden.io/quarantine": json.dumps(record)}}}
        node_cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch))
        node_cluster.kubectl("label", "node", REAL_NODE, "gpuwarden.io/e2e-poke=1", "--overwrite")
        time.sleep(3)
        assert agent.metric("gpuwarden_node_devices", 'health="Unhealthy"') == 0
        assert agent.metric("gpuwarden_node_devices", 'health="Healthy"') == 8
        # With the taint the record names GPU 0: it turns Unhealthy and the Node's allocatable drops by one.
        node_cluster.kubectl("taint", "node", REAL_NODE, "gpuwarden.io/gpu-unhealthy=xid-79:NoSchedule")
        poll(
            lambda: agent.metric("gpuwarden_node_devices", 'health="Unhealthy"') == 1,
            timeout=30,
            what="GPU 0 Unhealthy in the device plugin",
        )
        wait_allocatable(node_cluster, 7)
    finally:
        patch = {"metadata": {"annotations": {"gpuwarden.io/quarantine": None}}}
        node_cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch), check=False)
        node_cluster.kubectl("taint", "node", REAL_NODE, "gpuwarden.io/gpu-unhealthy-", check=False)
        node_cluster.kubectl("label", "node", REAL_NODE, "gpuwarden.io/e2e-poke-", check=False)
        node_cluster.kubectl(
            "delete", "pods", "--all", "-n", node_ns, "--grace-period=0", "--force", check=False
        )
        agent.stop()
