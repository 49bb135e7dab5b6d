"""A mixed cluster behind gpuwarden's extender: a device-plugin GPU node (kwok) and a DRA-backed one (the real
kubelet node running our DRA kubelet plugin, with a DeviceClass mapping `nvidia.com/gpu`).

kube-scheduler (v1.37: `DRAExtendedResource` GA) serves `nvidia.com/gpu` through DRA on the real node, whose
allocatable has none, and through the device plugin on the kwok node; it calls our extender for both. The
extender must place the device-plugin pod as before (a recorded GPU set) and pass the DRA pod through: no
rejection, no recorded set, a `GPUsAllocatedByDRA` Event - while DRA allocates its devices and the real
kubelet prepares them through our driver. Needs a scheduler with DRA extended resources (1.36 beta, 1.37 GA);
on an older test bed the module says so and fails (it is not in `make test-oldest`).

Then health on the DRA node: the fleet simulator exports DCGM metrics for the real node's eight GPUs with the
UUIDs our DRA driver publishes (both derive them from the node and the index), a real Prometheus scrapes
them, and the real health and drain loops run against this cluster. An XID 79 on one allocated device must
give one DeviceTaintRule for that device only (NoSchedule; the node keeps its GPUs and only our
PreferNoSchedule marker), the pod holding it evicted through the Eviction API, a new pod's claim allocated
around the tainted device, and the release must remove the rule.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from controller.drain.loop import DrainLoop
from controller.gpus.claimtemplate import claim_template as gpuwarden_claim_template
from controller.gpus.claimtemplate import pod_usage as gpuwarden_pod_usage
from controller.health.act import BREAKER_CONFIGMAP
from controller.health.devicerules import OWNED_SELECTOR
from controller.health.loop import HealthLoop
from controller.health.plan import HealthPlan
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import GPU_TOPOLOGY, QUARANTINE_RECORD, QUARANTINE_TAINT, RELEASE
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from harness.simulator.hardware import gpu_uuid
from harness.testbed import Cluster, poll
from harness.testbed.dra import (
    DRIVER_BINARY,
    DRIVER_NAME,
    NUMA_ATTRIBUTE,
    DraDriver,
    allocated_devices,
    device_class,
    slice_attributes,
)
from harness.testbed.images import TOOL_IMAGE
from harness.testbed.realnode import REAL_NODE_LABEL, REAL_NODE_TAINT, RealNode
from harness.testbed.waiting import PollTimeoutError
from tests.e2e.conftest import KWOK_NODE, REAL_NODE, free_port, gpuwarden_extender, scheduler_calling
from tests.e2e.test_dra_node import claim_pod
from tests.e2e.test_extender_scheduler import PREFIX, RunningExtender, topology

pytestmark = pytest.mark.e2e

EXTENDED = device_class(extended_resource=True)
CLASS = str(EXTENDED["metadata"]["name"])


@pytest.fixture(scope="module")
def mixed(node_cluster: Cluster) -> Iterator[tuple[DraDriver, RunningExtender]]:
    version = node_cluster.binaries.versions.get("kubernetes", "")
    minor = int(version.split(".")[1]) if version.count(".") >= 2 else 0
    if minor and minor < 37:
        pytest.fail(f"DRA-backed nvidia.com/gpu needs Kubernetes >= 1.37 here; the test bed is {version}")
    node: RealNode = node_cluster.real_node()
    driver = DraDriver(node, node_cluster.binaries.path(DRIVER_BINARY))
    node_cluster.apply(EXTENDED)
    # The device-plugin node as the node agent publishes it: 2 NUMA nodes x 4 GPUs.
    annotate(node_cluster, KWOK_NODE, json.dumps(topology(2, 4), separators=(",", ":")))
    driver.start()
    port = free_port()
    try:
        with scheduler_calling(node_cluster, gpuwarden_extender(port, PREFIX)):
            running = RunningExtender(node_cluster, port).start()
            try:
                poll(
                    lambda: (
                        running.extender is not None
                        and (view := running.extender.model.view(REAL_NODE)) is not None
                        and view.dra_class == CLASS
                    ),
                    timeout=60,
                    what=f"the extender's model sees {REAL_NODE} as DRA-backed ({CLASS})",
                )
                yield driver, running
            finally:
                running.stop()
    finally:
        driver.stop()
        annotate(node_cluster, KWOK_NODE, None)
        node_cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
        node_cluster.kubectl(
            "delete", "resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}", check=False
        )


def annotate(cluster: Cluster, node: str, topo: str | None) -> None:
    patch = {"metadata": {"annotations": {GPU_TOPOLOGY: topo}}}
    cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps(patch))


def gpu_pod(name: str, gpus: int, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": TOOL_IMAGE.name,
                    "imagePullPolicy": "Never",
                    "args": ["--env", "GWTEST_", "--sleep", "0"],
                    "resources": {"limits": {"cpu": "100m", "memory": "32Mi", "nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def wait_running(cluster: Cluster, ns: str, name: str, timeout: float) -> None:
    """Wait for the pod to run; on a timeout, fail with what `kubectl describe` says about it."""
    try:
        poll(lambda: pod_phase(cluster, ns, name) == "Running", timeout=timeout, what=f"{ns}/{name} Running")
    except PollTimeoutError:
        pytest.fail(cluster.kubectl("describe", "pod", name, "-n", ns, check=False), pytrace=False)


def events(cluster: Cluster, ns: str, reason: str) -> dict[str, dict[str, Any]]:
    items = cluster.get_json("events.events.k8s.io", "-n", ns)["items"]
    return {e["regarding"]["name"]: e for e in items if e.get("reason") == reason}


def test_extender_places_device_plugin_pods_and_passes_dra_pods_through(
    node_cluster: Cluster, mixed: tuple[DraDriver, RunningExtender], node_ns: str
) -> None:
    driver, _ = mixed
    ns = node_ns
    real = node_cluster.get_json("node", REAL_NODE)
    assert not int(real["status"].get("allocatable", {}).get("nvidia.com/gpu", "0") or 0)
    assert REAL_NODE_LABEL in real["metadata"]["labels"]
    doc = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [gpu_pod("on-dra", 2, REAL_NODE), gpu_pod("on-dp", 2, KWOK_NODE)],
    }
    node_cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(doc))

    wait_running(node_cluster, ns, "on-dra", 120)
    wait_running(node_cluster, ns, "on-dp", 60)

    dra_pod = node_cluster.get_json("pod", "on-dra", "-n", ns)
    assert dra_pod["spec"]["nodeName"] == REAL_NODE
    assert "gpuwarden.io/gpu-ids" not in (dra_pod["metadata"].get("annotations") or {})  # no fiction recorded
    claim_name = dra_pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = node_cluster.get_json("resourceclaim", claim_name, "-n", ns)
    devices = allocated_devices(claim)
    assert len(devices) == 2, claim["status"]
    attrs = slice_attributes(
        node_cluster.get_json("resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}")
    )
    assert set(devices) <= set(attrs)
    assert claim["metadata"]["uid"] in driver.prepared()  # prepared by the real kubelet through our driver

    dp_pod = node_cluster.get_json("pod", "on-dp", "-n", ns)
    assert dp_pod["spec"]["nodeName"] == KWOK_NODE
    ids = dp_pod["metadata"]["annotations"]["gpuwarden.io/gpu-ids"].split(",")
    assert len(ids) == 2  # the device-plugin path as before: a recorded set

    passed = poll(
        lambda: events(node_cluster, ns, "GPUsAllocatedByDRA").get("on-dra"),
        timeout=60,
        what="the GPUsAllocatedByDRA Event of on-dra",
    )
    assert f"node {REAL_NODE} serves its GPUs through DRA (DeviceClass {CLASS})" in passed["note"]
    assert "on-dp" in poll(
        lambda: events(node_cluster, ns, "GPUsAssigned") or None, timeout=60, what="GPUsAssigned of on-dp"
    )
    assert "on-dra" not in events(node_cluster, ns, "GPUsAssigned")
    for name in ("on-dra", "on-dp"):
        node_cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=true", timeout=90)
    poll(
        lambda: claim["metadata"]["uid"] not in driver.prepared(), timeout=60, what="the DRA claim unprepared"
    )


def pod_phase(cluster: Cluster, ns: str, name: str) -> str:
    return cluster.kubectl(
        "get", "pod", name, "-n", ns, "--ignore-not-found", "-o", "jsonpath={.status.phase}"
    )


def devices_of(cluster: Cluster, ns: str, name: str) -> list[str]:
    """The DRA devices the pod's claim (its own, or the one the scheduler made for nvidia.com/gpu) holds."""
    status = cluster.get_json("pod", name, "-n", ns)["status"]
    claim = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or next(
        s["resourceClaimName"] for s in status["resourceClaimStatuses"]
    )
    return allocated_devices(cluster.get_json("resourceclaim", claim, "-n", ns))


def node_slices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return slice_attributes(cluster.get_json("resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}"))


def test_a_single_numa_pod_gets_four_gpus_of_one_numa_node_beside_the_extender(
    node_cluster: Cluster, mixed: tuple[DraDriver, RunningExtender], node_ns: str
) -> None:
    """`gpuwarden dra claim-template --policy single-numa` in the mixed cluster (the scheduler also calls our
    extender): the pod's four devices share one NUMA node."""
    ns = node_ns
    template = gpuwarden_claim_template(gpus=4, policy="single-numa", device_class=CLASS, namespace=ns)
    name = str(template["metadata"]["name"])
    pod = claim_pod("aligned", name)
    pod["spec"].update(gpuwarden_pod_usage(name)["spec"] | {"containers": pod["spec"]["containers"]})
    doc = {"apiVersion": "v1", "kind": "List", "items": [template, pod]}
    node_cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(doc))
    wait_running(node_cluster, ns, "aligned", 90)
    devices = devices_of(node_cluster, ns, "aligned")
    attrs = node_slices(node_cluster)
    assert len(devices) == 4
    assert len({attrs[d][NUMA_ATTRIBUTE] for d in devices}) == 1, {d: attrs[d] for d in devices}
    node_cluster.kubectl("delete", "pod", "aligned", "-n", ns, "--wait=true", timeout=90)


def health_and_drain_config(cluster: Cluster, ns: str) -> Config:
    doc: dict[str, Any] = {
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "namespace": ns},
        "health": {
            "loop_interval_seconds": 1,
            "max_sample_age_seconds": 10,
            "healthy_period_seconds": 3,
            "xid": {"event_window_seconds": 30},
        },
        # One device-plugin GPU node besides the DRA one: the gate's floor is not what is tested here.
        "drain": {"enabled": True, "gate": {"min_schedulable_percent": 0}},
    }
    return Config.model_validate(doc)


FOREIGN_RULE = "driver-health-e2e"


def foreign_rule(device: str) -> dict[str, Any]:
    """A DeviceTaintRule as a driver's health check would write it (effect None: it changes no allocation)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": FOREIGN_RULE},
        "spec": {
            "deviceSelector": {"driver": DRIVER_NAME, "pool": REAL_NODE, "device": device},
            "taint": {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "None"},
        },
    }


def our_rules(cluster: Cluster) -> list[dict[str, Any]]:
    return list(cluster.get_json("devicetaintrules", "-l", OWNED_SELECTOR)["items"])


def our_taint(cluster: Cluster) -> str | None:
    taints = cluster.get_json("node", REAL_NODE)["spec"].get("taints") or []
    return next((f"{t['value']}:{t['effect']}" for t in taints if t["key"] == QUARANTINE_TAINT), None)


def unquarantine(cluster: Cluster, ns: str) -> None:
    node = cluster.get_json("node", REAL_NODE)
    taints = [t for t in node["spec"].get("taints") or [] if t["key"] != QUARANTINE_TAINT]
    ann = {QUARANTINE_RECORD: None, "gpuwarden.io/release": None, "gpuwarden.io/drain": None}
    patch = {"spec": {"taints": taints or None}, "metadata": {"annotations": ann}}
    cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch))
    drop = {"status": {"conditions": [{"type": "GPUHealthy", "$patch": "delete"}]}}
    cluster.kubectl(
        "patch", "node", REAL_NODE, "--subresource=status", "--type=strategic", "-p", json.dumps(drop)
    )
    cluster.kubectl("delete", "devicetaintrules", "-l", OWNED_SELECTOR, "--ignore-not-found", check=False)
    cluster.kubectl("delete", "configmap", BREAKER_CONFIGMAP, "-n", ns, "--ignore-not-found", check=False)


async def passes(
    run: Callable[[], Any], done: Callable[[], bool], what: str, within: float = 60,
    detail: Callable[[], str] = str,
) -> None:  # fmt: skip
    """`run()` (one loop pass), 1 s apart, until `done()`."""
    deadline = time.monotonic() + within
    while True:
        await run()
        if await asyncio.to_thread(done):
            return
        assert time.monotonic() < deadline, f"timed out: {what}{detail()}"
        await asyncio.sleep(1.0)


async def test_xid_on_one_dra_device_taints_that_device_drains_its_holder_and_release_removes_the_rule(
    node_cluster: Cluster, mixed: tuple[DraDriver, RunningExtender], node_ns: str, tmp_path: Path
) -> None:
    ns = node_ns
    cluster = node_cluster
    await asyncio.to_thread(
        cluster.kubectl, "create", "-n", ns, "-f", "-", input=json.dumps(gpu_pod("holder", 2, REAL_NODE))
    )
    await asyncio.to_thread(wait_running, cluster, ns, "holder", 120)
    held = devices_of(cluster, ns, "holder")
    attrs = node_slices(cluster)
    faulty = sorted(held)[0]
    index = int(attrs[faulty]["index"])
    assert attrs[faulty]["uuid"] == gpu_uuid(REAL_NODE, index)  # DCGM and the ResourceSlice agree

    scenario = parse_scenario(
        {"fleet": {"nodes": 1, "node_name_pattern": "real-node-{index}", "gpus_per_node": 8},
         "exporter": {"tick": 0.5}}
    )  # fmt: skip
    assert scenario.fleet.node_names() == [REAL_NODE]
    sim = await start(scenario)
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)]
    )
    config = health_and_drain_config(cluster, ns)
    try:
        await prom.start()
        await prom.wait_for_up("dcgm")
        prom_cfg = config.prometheus.model_copy(update={"url": prom.url})
        async with (
            PrometheusClient(prom_cfg) as promclient,
            KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube,
        ):
            health = HealthLoop(config, promclient, kube, registry=CollectorRegistry())
            drain = DrainLoop(config, kube, instance="e2e-dra")
            tasks = [asyncio.ensure_future(health.informer.run())]
            tasks += [asyncio.ensure_future(c.run()) for c in drain.caches()]
            try:
                await asyncio.wait_for(health.informer.synced.wait(), 30)
                await drain.wait_ready()
                plans: list[HealthPlan] = []

                async def health_pass() -> None:
                    plans.append(await health.run_once())

                await health_pass()
                assert our_rules(cluster) == [] and our_taint(cluster) is None  # healthy: nothing written

                async with httpx.AsyncClient() as http:
                    fault = {"kind": "xid", "node": REAL_NODE, "gpu": index, "code": 79}
                    (await http.post(f"{sim.url}/control/faults", json=fault)).raise_for_status()
                await passes(health_pass, lambda: bool(our_rules(cluster)), "a DeviceTaintRule")
                (rule,) = our_rules(cluster)
                assert rule["spec"]["deviceSelector"] == {"driver": DRIVER_NAME, "pool": REAL_NODE,
                                                          "device": faulty}, rule  # fmt: skip
                assert rule["spec"]["taint"]["effect"] == "NoSchedule"
                assert our_taint(cluster) == "xid-79:PreferNoSchedule"  # the marker: the node keeps its GPUs
                record = json.loads(
                    cluster.get_json("node", REAL_NODE)["metadata"]["annotations"][QUARANTINE_RECORD]
                )
                assert record["state"] == "quarantined" and record["xids"] == [79]

                # The holder is moved through the Eviction API (drain), not deleted by a NoExecute taint.
                assert pod_phase(cluster, ns, "holder") == "Running"
                await passes(
                    drain.run_once, lambda: not pod_phase(cluster, ns, "holder"), "holder evicted", 90
                )
                evicted = events(cluster, ns, "GPUPodEvicted")
                assert "holder" in evicted, sorted(evicted)

                # A new pod asking for seven GPUs gets exactly the seven untainted devices.
                await asyncio.to_thread(
                    cluster.kubectl,
                    "create",
                    "-n",
                    ns,
                    "-f",
                    "-",
                    input=json.dumps(gpu_pod("after", 7, REAL_NODE)),
                )
                await asyncio.to_thread(wait_running, cluster, ns, "after", 120)
                got = devices_of(cluster, ns, "after")
                assert len(got) == 7 and faulty not in got, got

                # A rule of someone else's (the driver's own health check, an operator) on the same device:
                # never ours to touch, before or after our release.
                await asyncio.to_thread(cluster.apply, foreign_rule(faulty))

                # XID 79 recovers only by a reboot (the catalog): a GPU reset clears the XID, and the operator
                # who replaced the part releases the quarantine; our rule goes with it.
                async with httpx.AsyncClient() as http:
                    clear = {"node": REAL_NODE, "reset": True}
                    (await http.request("DELETE", f"{sim.url}/control/faults", json=clear)).raise_for_status()
                release = {"metadata": {"annotations": {RELEASE: "now"}}}
                await asyncio.to_thread(
                    cluster.kubectl, "patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(release)
                )
                await passes(health_pass, lambda: not our_rules(cluster), "the rule removed on release", 60,
                             detail=lambda: "\n" + plans[-1].render_table())  # fmt: skip
                assert our_taint(cluster) is None
                assert any(p.actions_of("release") for p in plans)
                await drain.run_once()  # the released node's drain state is settled, nothing more evicted
                assert pod_phase(cluster, ns, "after") == "Running"
                foreign = cluster.get_json("devicetaintrule", FOREIGN_RULE)
                want = foreign_rule(faulty)["spec"]  # untouched (the API server adds taint.timeAdded)
                assert foreign["spec"]["deviceSelector"] == want["deviceSelector"]
                assert {k: foreign["spec"]["taint"].get(k) for k in want["taint"]} == want["taint"]
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await prom.stop()
        await sim.stop()
        await asyncio.to_thread(unquarantine, cluster, ns)
        await asyncio.to_thread(
            cluster.kubectl, "delete", "devicetaintrule", FOREIGN_RULE, "--ignore-not-found", check=False
        )
        for name in ("holder", "after"):
            await asyncio.to_thread(
                cluster.kubectl,
                "delete",
                "pod",
                name,
                "-n",
                ns,
                "--ignore-not-found",
                "--wait=true",
                timeout=90,
            )
