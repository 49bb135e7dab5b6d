"""Installed as users install it: the chart, our image, pods on the real kubelet node.

Every other e2e test runs gpuwarden as host processes. Here nothing of gpuwarden runs on the host: the image
``make image`` built is imported into the real node's containerd, and one ``helm install`` of
deploy/helm/gpuwarden (image = that image, under the chart's own default reference) creates everything the
chart deploys, all as pods on that node: the adapter with resource metrics on (``resourceMetrics.enabled``,
kube-prometheus's resource rules), the controller with its extender, and the node agent as the node's device
plugin. Everything else is what a cluster does with them:

- the pods become Ready through their real probes (the kubelet calls /readyz on the pod IP), as 65532 with a
  read-only root file system, in a namespace enforcing Pod Security ``restricted`` (no warning at install);
- they reach the API server through the ``kubernetes`` Service (kube-proxy on the node) and Prometheus
  through the node IP (a relay to the loopback-only test Prometheus);
- the chart's four APIServices become Available through the aggregator dialling the adapter Service, i.e.
  the adapter *pods* (kube-proxy again), and serve discovery and a metric read;
- ``kubectl top pods`` in the release's namespace (and the node agent's) prints our own pods' usage through
  our own metrics.k8s.io: the real Prometheus scrapes the real kubelet's /metrics/cadvisor and
  /metrics/resource (as kube-prometheus does), the adapter pods answer from it;
- the real HPA scales a Deployment on the external metric the adapter pods serve;
- kube-scheduler, configured from the chart's scheduler config, calls the extender in the controller pods
  through its Service and binds a GPU pod (the extender's bind records the GPU set);
- deleting the controller's leader pod hands the Lease to the other replica (time printed) while the
  extender, called through its Service, keeps answering;
- ``helm upgrade`` with a changed value rolls the pods;
- the node agent pod has registered its device plugin with the kubelet, and a GPU pod placed through the
  extender gets exactly the recorded GPUs in its container;
- ``helm uninstall`` leaves no cluster-wide object; then ``kubectl apply -k`` of deploy/base: Ready under
  its own ``restricted`` namespace with no warning, its APIServices Available, a metric read.

Timings (pod start -> Ready, handover) and memory are printed, never asserted. A pod's memory is its
working set as ``kubectl top`` prints it (what the kubelet measures, through our metrics.k8s.io), with the
RSS of the processes in its cgroup from the node's /proc beside it. The node agent's topology comes from the
chart's ``nodeAgent.topology`` value: this machine has no GPU.

Runs in a pytest process of its own (Makefile ``e2e``): it needs the machine's one real kubelet node with
pod networking, which the session-wide ``node_cluster`` of the other modules also takes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.localprom import LocalPrometheus
from harness.testbed import (
    Binaries,
    Cluster,
    ClusterConfig,
    GpuNodeSpec,
    add_gpu_nodes,
    ensure_namespace,
    poll,
    wait_apiservice_available,
)
from harness.testbed.product_image import ProductImage, ProductImageError, archive_path
from harness.testbed.realnode import RealNodeSpec
from harness.testbed.relay import Relay
from nodeagent.reconcile import GPU_IDS_ANNOTATION
from tests.e2e.conftest import KubeletMetricsRelay, pod_manifest
from tests.e2e.installed import (
    APISERVICES,
    NODE,
    NODE_NS,
    NS,
    RELEASE,
    RESOURCE_APISERVICE,
    UUIDS,
    WORKING_SET,
    Installed,
    Obj,
    chart_scheduler_config,
    extender_answers,
    install_values,
    kubectl_top,
    kustomize_overlay,
    lease_holder,
    mib,
    pod_rss_mib,
    pod_security_warnings,
    prom_query,
    ready,
    release_objects,
    run_kubectl,
    start_to_ready,
    wait_release_ready,
)
from tests.e2e.test_helm_chart import CHART, helm
from tests.e2e.test_kubelet_node import create, tool_pod, wait_phase
from tests.e2e.test_node_agent import visible_devices

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    try:
        image = ProductImage.load(archive_path())
    except ProductImageError as exc:
        pytest.fail(f"the image is not built: {exc}", pytrace=False)
    workdir = tmp_path_factory.mktemp("installed")
    config = ClusterConfig(
        name=f"gw-installed-{os.getpid()}",
        workdir=workdir / "kwok",
        real_nodes=[RealNodeSpec(name=NODE, images=[image.archive], standard_pod_resources_path=True)],
        pod_network=True,
    )
    cluster = Cluster.create(config, Binaries.locate())
    prom = LocalPrometheus(workdir / "prometheus", self_scrape=True)
    relay: Relay | None = None
    kubelet: KubeletMetricsRelay | None = None
    try:
        asyncio.run(prom.start())
        # A QPS series for the chart's default external rule (http_requests_total with namespace and pod):
        # Prometheus' own request counter, scraped again under those labels.
        prom.scrape_configs.append(
            {
                "job_name": "qps",
                "static_configs": [
                    {"targets": [prom.url.split("//", 1)[1]], "labels": {"namespace": NS, "pod": "web-0"}}
                ],
                "metric_relabel_configs": [
                    {
                        "source_labels": ["__name__"],
                        "regex": "prometheus_http_requests_total",
                        "target_label": "__name__",
                        "replacement": "http_requests_total",
                    }
                ],
            }
        )
        # The real kubelet, scraped as kube-prometheus scrapes it (cAdvisor and the resource endpoint): the
        # usage the chart's metrics.k8s.io serves for our own pods.
        kubelet = KubeletMetricsRelay(cluster, NODE).start()
        prom.scrape_configs.extend(kubelet.targets(scrape_interval_seconds=5))
        asyncio.run(prom.reload())
        node_ip = cluster.real_node().node_ip
        relay = Relay(node_ip, int(prom.url.rsplit(":", 1)[1])).start()
        ensure_namespace(
            cluster,
            NS,
            {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        )
        # The real node is a GPU node, labelled as gpu-operator labels one (the node agent's nodeSelector).
        cluster.kubectl("label", "node", NODE, "nvidia.com/gpu.present=true", "--overwrite")
        chart_defaults = yaml.safe_load((CHART / "values.yaml").read_text())
        values = workdir / "values.yaml"
        values.write_text(yaml.safe_dump(install_values(f"http://{node_ip}", relay.port, chart_defaults)))
        t0 = time.monotonic()
        done = helm("install", RELEASE, str(CHART), "-n", NS, "-f", str(values), cluster=cluster, timeout=120)
        assert done.returncode == 0, done.stderr
        inst = Installed(cluster, image, relay.url, done.stdout + done.stderr, values)
        wait_release_ready(inst)
        try:
            poll(inst.node_agent_pod, timeout=120, interval=1, what="the node agent pod Ready")
        except TimeoutError as exc:
            logs = cluster.kubectl(
                "logs", "-n", NODE_NS, "-l", "app.kubernetes.io/component=node-agent", check=False
            )
            events = cluster.kubectl("get", "events", "-n", NODE_NS, check=False)
            raise AssertionError(f"{exc}\nlogs:\n{logs[-3000:]}\nevents:\n{events[-3000:]}") from exc
        inst.numbers["install_to_all_ready_s"] = round(time.monotonic() - t0, 1)
        yield inst
        print(f"\n[installed] numbers: {json.dumps(inst.numbers, sort_keys=True)}")
    finally:
        if relay is not None:
            relay.stop()
        if kubelet is not None:
            kubelet.stop()
        asyncio.run(prom.stop())
        cluster.delete()


def test_pods_run_our_image_and_become_ready_through_their_probes(installed: Installed) -> None:
    pods = installed.pods()
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {"adapter", "controller"}
    config_digest = installed.image.config_digest
    for pod in pods:
        status = pod["status"]["containerStatuses"][0]
        assert status["image"] == installed.image.ref, status
        # containerd names an imported image by its config digest (no registry, so no repo digest).
        assert status["imageID"].split("@")[-1] in (config_digest, installed.image.digest), status
        assert pod["spec"]["nodeName"] == NODE
        container = pod["spec"]["containers"][0]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]
    agent = installed.node_agent_pod()
    assert agent is not None and agent["status"]["containerStatuses"][0]["image"] == installed.image.ref
    by_component = {"adapter": installed.pods("adapter"), "controller": installed.pods("controller")}
    by_component["node_agent"] = [agent]
    for component, component_pods in by_component.items():
        times = [start_to_ready(p) for p in component_pods]
        rss = [pod_rss_mib(p["metadata"]["uid"]) for p in component_pods]
        installed.numbers[f"{component}_pod_created_to_ready_s"] = [round(a, 1) for a, _ in times]
        installed.numbers[f"{component}_container_started_to_ready_s"] = [round(b, 1) for _, b in times]
        installed.numbers[f"{component}_rss_mib_node_proc"] = [round(r, 1) for r in rss]
        assert all(r > 0 for r in rss), f"no process found in the {component} pods' cgroups"
    print(f"\n[installed] {json.dumps(installed.numbers, sort_keys=True)}")


def test_kubectl_top_shows_our_pods_through_our_metrics_api(installed: Installed) -> None:
    """`kubectl top pods` in the release's namespace (and the node agent's) answered by the chart's
    metrics.k8s.io: the aggregator -> the adapter pods -> Prometheus -> the real kubelet's resource endpoint.
    What it prints is each gpuwarden pod's working set as the kubelet measured it (checked against the series
    Prometheus holds); the node's /proc RSS of the same pods is kept beside it in the numbers."""
    cluster = installed.cluster
    svc = cluster.get_json("apiservice", RESOURCE_APISERVICE)["spec"]["service"]
    assert (svc["namespace"], svc["name"]) == (NS, "gpuwarden-adapter")
    wait_apiservice_available(cluster, RESOURCE_APISERVICE, timeout=120)
    agent = installed.node_agent_pod()
    assert agent is not None
    pods = {NS: installed.pods(), NODE_NS: [agent]}
    t0 = time.monotonic()
    for namespace, namespace_pods in pods.items():
        want = {p["metadata"]["name"]: p["spec"]["containers"][0]["name"] for p in namespace_pods}
        try:
            rows = poll(
                functools.partial(kubectl_top, cluster, namespace, set(want)),
                timeout=150,
                interval=3,
                what=f"kubectl top pods -n {namespace} with every pod",
            )
        except TimeoutError as exc:
            result = run_kubectl(cluster, "top", "pods", "-n", namespace, "--containers")
            held = prom_query(installed.prometheus_url, f'{WORKING_SET}{{namespace="{namespace}"}}')
            raise AssertionError(f"{exc}\n{result.stdout}{result.stderr}\nPrometheus: {held[:4]}") from exc
        print(f"\n[installed] kubectl top pods -n {namespace} --containers:")
        for pod, container in want.items():
            _, container_name, cpu, memory = rows[pod]
            print(f"[installed]   {' '.join(rows[pod])}")
            assert container_name == container, rows[pod]  # no phantom pod-level (container="") row
            assert cpu.endswith("m") and memory.endswith(("Ki", "Mi", "Gi")), rows[pod]
            selector = f'namespace="{namespace}",pod="{pod}",container="{container}"'
            held = prom_query(installed.prometheus_url, f"{WORKING_SET}{{{selector}}}")
            assert held, f"Prometheus holds no working set of {pod}"
            kubelet_mib = float(held[0]["value"][1]) / 2**20
            # what kubectl printed is what the kubelet measured (a later scrape may have moved it a little)
            assert mib(memory) > 10 and abs(mib(memory) - kubelet_mib) <= 8, (pod, memory, kubelet_mib)
            component = "node_agent" if namespace == NODE_NS else container
            installed.numbers.setdefault(f"{component}_working_set_mib_kubectl_top", []).append(
                round(mib(memory), 1)
            )
            installed.numbers.setdefault(f"{component}_cpu_kubectl_top", []).append(cpu)
    installed.numbers["kubectl_top_answered_after_s"] = round(time.monotonic() - t0, 1)
    print(f"[installed] {json.dumps(installed.numbers, sort_keys=True)}")


def test_restricted_pod_security_without_warnings(installed: Installed) -> None:
    assert "warning" not in installed.install_output.lower(), installed.install_output
    labels = installed.kubectl_json("get", "namespace", NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # The running pods, evaluated again by Pod Security admission: none in the release's namespace; the node
    # agent's (hostPath volumes, root: its namespace is privileged) shows what a violation looks like.
    warnings = pod_security_warnings(installed.cluster, NS)
    assert "warning" not in warnings.lower(), warnings
    agent = pod_security_warnings(installed.cluster, NODE_NS)
    assert "violate" in agent and "restricted volume types" in agent and "runAsNonRoot" in agent, agent
    for pod in installed.pods():
        spec = pod["spec"]
        sc = spec["containers"][0]["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc.get("allowPrivilegeEscalation") is False
        assert spec["securityContext"]["runAsNonRoot"] is True


def test_processes_run_as_65532_on_a_read_only_root(installed: Installed) -> None:
    pod = installed.pods("controller")[0]["metadata"]["name"]
    script = (
        "import os\n"
        "print(os.getuid(), os.getgid())\n"
        "try:\n    open('/probe', 'w')\nexcept OSError as e:\n    print('write', e.errno)\n"
    )
    out = installed.cluster.kubectl("exec", "-n", NS, pod, "--", "python", "-c", script)
    lines = out.split()
    assert lines[:2] == ["65532", "65532"], out
    assert lines[2:] == ["write", "30"], out  # EROFS


def test_apiservices_available_through_the_adapter_pods(installed: Installed) -> None:
    cluster = installed.cluster
    t0 = time.monotonic()
    for name in (*APISERVICES, RESOURCE_APISERVICE):
        svc = (cluster.get_json("apiservice", name)["spec"] or {})["service"]
        assert svc["namespace"] == NS and svc["name"] == "gpuwarden-adapter"
        wait_apiservice_available(cluster, name, timeout=120)
    installed.numbers["apiservices_available_after_ready_s"] = round(time.monotonic() - t0, 1)
    endpoints = cluster.get_json("endpoints", "gpuwarden-adapter", "-n", NS)
    pod_ips = {p["status"]["podIP"] for p in installed.pods("adapter")}
    served = {a["ip"] for s in endpoints.get("subsets") or [] for a in s.get("addresses") or []}
    assert served == pod_ips, (served, pod_ips)
    for group in ("custom.metrics.k8s.io/v1beta2", "external.metrics.k8s.io/v1beta1"):
        doc = json.loads(cluster.kubectl("get", "--raw", f"/apis/{group}"))
        assert doc["kind"] == "APIResourceList" and doc["groupVersion"] == group
    # A metric read through the aggregator -> adapter pod -> Prometheus (through the relay): the chart's
    # default external rule over the test's QPS series for this namespace.
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/http_requests_per_second"

    def served() -> Obj | None:
        out = cluster.kubectl("get", "--raw", path, check=False)
        doc: Obj | None = json.loads(out) if out else None
        return doc if doc and doc.get("items") else None

    values = poll(served, timeout=90, interval=2, what="http_requests_per_second served for the namespace")
    assert values["kind"] == "ExternalMetricValueList"
    assert values["items"][0]["metricName"] == "http_requests_per_second"


@pytest.fixture(scope="module")
def kwok_node(installed: Installed) -> str:
    """One kwok GPU node (8 GPUs, 2 NUMA nodes) for workloads that never run: GPU jobs, HPA targets."""
    gpus = {str(i): {"numa": i // 4, "pcie": f"pci{i // 2}", "uuid": f"GPU-installed-{i}"} for i in range(8)}
    add_gpu_nodes(installed.cluster, [GpuNodeSpec(name="gpu-kwok-0", gpus=8, topology=gpus)])
    return "gpu-kwok-0"


def test_the_hpa_scales_on_a_metric_the_adapter_pod_serves(installed: Installed, kwok_node: str) -> None:
    """kube-controller-manager's HPA reads http_requests_per_second through the aggregator from the adapter
    pods and scales a Deployment (on the kwok node; its pods never run)."""
    cluster = installed.cluster
    restricted = {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    web = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeName": kwok_node,
                    "containers": [
                        {"name": "web", "image": "registry.invalid/web:1", "securityContext": restricted}
                    ],
                },
            },
        },
    }
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "http_requests_per_second"},
                        "target": {"type": "Value", "value": "1m"},
                    },
                }
            ],
        },
    }
    cluster.apply(web, hpa)
    t0 = time.monotonic()
    try:

        def scaled() -> Obj | None:
            doc = cluster.get_json("hpa", "web", "-n", NS)
            return doc if (doc.get("status") or {}).get("desiredReplicas") == 3 else None

        status = poll(scaled, timeout=90, interval=1, what="the HPA at 3 replicas")["status"]
        installed.numbers["hpa_scaled_after_s"] = round(time.monotonic() - t0, 1)
        value = status["currentMetrics"][0]["external"]["current"]["value"]
        print(
            f"\n[installed] HPA desired 3 replicas on http_requests_per_second={value} from the adapter pods"
        )
        poll(
            lambda: cluster.get_json("deployment", "web", "-n", NS)["spec"]["replicas"] == 3,
            timeout=30,
            what="the Deployment scaled to 3",
        )
    finally:
        cluster.kubectl("delete", "hpa,deployment", "web", "-n", NS, "--wait=false", check=False)


def test_kube_scheduler_calls_the_extender_in_the_controller_pod(
    installed: Installed, kwok_node: str
) -> None:
    cluster = installed.cluster
    config = chart_scheduler_config(installed)
    assert config["extenders"][0]["bindVerb"] == "bind"
    original = yaml.safe_load(Path(cluster.scheduler_config_path()).read_text())
    cluster.restart_scheduler(config)
    ns = "gw-installed-jobs"
    ensure_namespace(cluster, ns)
    try:
        pod = pod_manifest("gpu-job", gpus=2, schedulerName="gpuwarden-scheduler")
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(pod))
        t0 = time.monotonic()

        def bound() -> Obj | None:
            doc = cluster.get_json("pod", "gpu-job", "-n", ns)
            return doc if doc["spec"].get("nodeName") else None

        try:
            placed = poll(bound, timeout=60, what="the GPU pod bound")
        except TimeoutError as exc:
            events = cluster.kubectl("get", "events", "-n", ns, check=False)
            logs = cluster.kubectl(
                "logs", "-n", NS, "-l", "app.kubernetes.io/component=controller", check=False
            )
            sched = cluster.logs("kube-scheduler").read_text(errors="replace").splitlines()[-15:]
            raise AssertionError(
                f"{exc}\nevents:\n{events}\ncontroller:\n{logs[-3000:]}\nscheduler:\n{sched}"
            ) from exc
        installed.numbers["gpu_pod_create_to_bound_s"] = round(time.monotonic() - t0, 1)
        assert placed["spec"]["nodeName"] == kwok_node
        # Only the extender's bind writes the GPU set before binding (the default binder never does).
        ids = placed["metadata"].get("annotations", {}).get("gpuwarden.io/gpu-ids", "")
        assert len(ids.split(",")) == 2, placed["metadata"].get("annotations")
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.restart_scheduler(original)


def test_leader_pod_deletion_hands_over_and_the_extender_keeps_answering(installed: Installed) -> None:
    cluster = installed.cluster
    holder = poll(lambda: lease_holder(cluster), timeout=60, what="a controller leader")
    pods = [p["metadata"]["name"] for p in installed.pods("controller")]
    leader = next((p for p in pods if p in holder), None)
    assert leader is not None, (holder, pods)
    service = cluster.get_json("service", "gpuwarden-controller", "-n", NS)
    url = f"http://{service['spec']['clusterIP']}:8888"
    assert extender_answers(url), "the extender Service does not answer before the handover"
    t0 = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", NS, leader, "--wait=false")
    answered, failed = 0, 0

    def new_holder() -> str | None:
        nonlocal answered, failed
        if extender_answers(url):
            answered += 1
        else:
            failed += 1
        h = lease_holder(cluster)
        return h if h and leader not in h else None

    taken = poll(new_holder, timeout=90, interval=0.2, what="the Lease held by another controller pod")
    handover = time.monotonic() - t0
    installed.numbers["leader_handover_s"] = round(handover, 1)
    installed.numbers["extender_answers_during_handover"] = f"{answered} ok / {failed} failed"
    print(f"\n[installed] leader {leader} deleted -> {taken} leads after {handover:.1f}s")
    print(f"[installed] extender through its Service during the handover: {answered} ok, {failed} failed")
    # Any live controller pod may win: the other replica, or the replacement the ReplicaSet starts at once.
    live = [p["metadata"]["name"] for p in installed.pods("controller")]
    assert any(p in taken for p in live if p != leader), (taken, live)
    assert answered > 0 and failed == 0, f"extender answered {answered}, failed {failed} during the handover"
    wait_release_ready(installed)


def test_helm_upgrade_with_a_changed_value_rolls_the_pods(installed: Installed) -> None:
    before = {p["metadata"]["name"] for p in installed.pods()}
    done = helm(
        "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values",
        "--set", "podAnnotations.gpuwarden-e2e/rolled=yes",
        "--set", "controller.podAnnotations.gpuwarden-e2e/rolled=yes",
        cluster=installed.cluster,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    t0 = time.monotonic()
    pods = wait_release_ready(installed)
    installed.numbers["upgrade_roll_s"] = round(time.monotonic() - t0, 1)
    after = {p["metadata"]["name"] for p in pods}
    assert before.isdisjoint(after), (before, after)
    assert all(p["metadata"]["annotations"].get("gpuwarden-e2e/rolled") == "yes" for p in pods)


def test_node_agent_pod_registers_its_device_plugin(installed: Installed) -> None:
    """The node agent the install started in enforce mode: its pod on the real node publishes the GPU topology
    (from the chart's topology value: this machine has no GPU) and registers with the kubelet as the device
    plugin for nvidia.com/gpu, so the Node offers those GPUs; a GPU pod placed through the extender gets
    exactly the GPUs the extender recorded."""
    cluster = installed.cluster
    pod = poll(installed.node_agent_pod, timeout=120, interval=1, what="the node agent pod Ready")
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["containerStatuses"][0]["image"] == installed.image.ref

    def offered() -> Obj | None:
        node = cluster.get_json("node", NODE)
        return node if (node["status"].get("allocatable") or {}).get("nvidia.com/gpu") == "8" else None

    node = poll(offered, timeout=60, interval=1, what="nvidia.com/gpu: 8 allocatable on the real node")
    published = json.loads(node["metadata"]["annotations"]["gpuwarden.io/gpu-topology"])
    assert sorted(published) == sorted(UUIDS)  # ids are the device plugin's ids (uuid strategy)

    # A 2-GPU pod placed by the chart's scheduler configuration: the extender in the controller pods records
    # the GPU set, the node agent pod (the kubelet's device plugin) hands the container exactly that set.
    original = yaml.safe_load(Path(cluster.scheduler_config_path()).read_text())
    cluster.restart_scheduler(chart_scheduler_config(installed))
    ns = "gw-installed-gpu"
    ensure_namespace(cluster, ns)
    try:
        job = tool_pod("two", ["--env", "NVIDIA_VISIBLE_DEVICES", "--sleep", "0"], gpus=2)
        job["spec"]["schedulerName"] = "gpuwarden-scheduler"
        create(cluster, ns, job)
        wait_phase(cluster, ns, "two", "Running", "Succeeded")
        seen = visible_devices(cluster, ns, "two")
        recorded = cluster.get_json("pod", "two", "-n", ns)["metadata"]["annotations"][GPU_IDS_ANNOTATION]
        assert len(seen) == 2 and sorted(seen) == sorted(recorded.split(",")), (seen, recorded)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.restart_scheduler(original)


def test_helm_uninstall_leaves_no_cluster_wide_object(installed: Installed, kwok_node: str) -> None:
    """And its pre-delete hook (`gpuwarden uninstall`, our image on the real node) lifts what gpuwarden wrote
    on objects it does not own: taint, condition, annotation, DeviceTaintRule, Lease; others' are kept."""
    cluster = installed.cluster
    before = release_objects(cluster)
    assert any(o.startswith("apiservice") for o in before), before
    assert any(o.startswith("clusterrole") for o in before), before
    node = kwok_node  # excluded from the controller below: only the hook lifts what is written on it
    cluster.kubectl("label", "node", node, "gpuwarden.io/exclude=true", "--overwrite")
    cluster.kubectl(
        "annotate", "node", node, "gpuwarden.io/quarantine={}", "example.com/theirs=1", "--overwrite"
    )
    cluster.kubectl("taint", "node", node, "gpuwarden.io/gpu-unhealthy=xid-79:NoSchedule", "--overwrite")
    cluster.kubectl("taint", "node", node, "example.com/theirs=1:NoSchedule", "--overwrite")
    now = "2026-12-07T00:00:00Z"
    condition = {"type": "GPUHealthy", "status": "False", "reason": "Xid79", "message": "",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic",
                    "-p", json.dumps({"status": {"conditions": [condition]}}))  # fmt: skip
    taint = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    labels = {"app.kubernetes.io/managed-by": "gpuwarden"}
    rule = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "gpuwarden-e2e-left", "labels": labels},
            "spec": {"deviceSelector": {"driver": "gpu.example.com", "pool": node, "device": "gpu-0"},
                     "taint": taint}}  # fmt: skip
    cluster.apply(rule)
    assert cluster.get_json("lease", "gpuwarden-controller", "-n", NS)
    try:
        t0 = time.monotonic()
        done = helm(
            "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "180s", cluster=cluster, timeout=240
        )
        installed.numbers["helm_uninstall_with_hook_s"] = round(time.monotonic() - t0, 1)
        if done.returncode != 0:
            hook = "app.kubernetes.io/component=uninstall"
            logs = cluster.kubectl("logs", "-n", NS, "-l", hook, "--tail=40", check=False)
            raise AssertionError(f"{done.stderr}\nthe hook's log:\n{logs}")
        assert release_objects(cluster) == []
        poll(lambda: not installed.pods(), timeout=120, what="the release's pods gone")
        after = cluster.get_json("node", node)
        annotations = after["metadata"].get("annotations", {})
        assert "gpuwarden.io/quarantine" not in annotations and annotations["example.com/theirs"] == "1"
        assert [t["key"] for t in after["spec"].get("taints", [])] == ["example.com/theirs"]
        assert "GPUHealthy" not in {c["type"] for c in after["status"].get("conditions", [])}
        assert after["metadata"]["labels"]["gpuwarden.io/exclude"] == "true"  # the operator's: kept
        left = cluster.kubectl("get", "devicetaintrules", "-o", "name", check=False)
        assert "gpuwarden-e2e-left" not in left, left
        lease = cluster.kubectl("get", "lease", "gpuwarden-controller", "-n", NS, "-o", "name", check=False)
        assert not lease.strip(), lease
    finally:
        cluster.kubectl("label", "node", node, "gpuwarden.io/exclude-", check=False)
        cluster.kubectl(
            "annotate", "node", node, "example.com/theirs-", "gpuwarden.io/quarantine-", check=False
        )
        for key in ("example.com/theirs-", "gpuwarden.io/gpu-unhealthy-"):  # one per call: kubectl removes
            cluster.kubectl("taint", "node", node, key, check=False)  # none when one key is absent
        cluster.kubectl("delete", "devicetaintrule", "gpuwarden-e2e-left", "--ignore-not-found", check=False)


def test_kustomize_base_installs_the_same_image(installed: Installed, tmp_path: Path) -> None:
    """After the Helm release is gone: `kubectl apply -k` of deploy/base (the user's Prometheus, our node):
    the pods Ready under the base's own Pod Security `restricted` with no warning, and a metric read."""
    cluster = installed.cluster
    assert release_objects(cluster) == [], "run after the helm uninstall test (same APIService names)"
    overlay = kustomize_overlay(installed, tmp_path / "overlay")
    t0 = time.monotonic()
    applied = run_kubectl(cluster, "apply", "-k", str(overlay), timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert "apiservice.apiregistration.k8s.io/v1beta1.custom.metrics.k8s.io" in applied.stdout, applied.stdout
    assert "warning" not in applied.stderr.lower(), applied.stderr

    def all_four_ready() -> list[Obj] | None:
        pods = cluster.get_json("pods", "-n", "gpuwarden")["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return live if len(live) == 4 and all(ready(p) for p in live) else None

    pods = poll(all_four_ready, timeout=240, interval=1.0, what="the kustomize base's 4 pods Ready")
    installed.numbers["kustomize_apply_to_ready_s"] = round(time.monotonic() - t0, 1)
    assert {p["status"]["containerStatuses"][0]["image"] for p in pods} == {installed.image.ref}
    # Admitted under the base namespace's enforce=restricted, and the running pods, evaluated again by Pod
    # Security admission, draw no warning.
    labels = cluster.get_json("namespace", "gpuwarden")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
    warnings = pod_security_warnings(cluster, "gpuwarden")
    assert "warning" not in warnings.lower(), warnings
    for name in APISERVICES:
        assert cluster.get_json("apiservice", name)["spec"]["service"]["namespace"] == "gpuwarden"
        wait_apiservice_available(cluster, name, timeout=120)
    raw = cluster.kubectl("get", "--raw", "/apis/custom.metrics.k8s.io/v1beta1")
    assert json.loads(raw)["kind"] == "APIResourceList"
    # A metric read through the base's APIService -> its adapter pods -> the user's Prometheus: the base's
    # namespace QPS rule over the test's series.
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/http_requests_per_second"

    def served() -> Obj | None:
        out = cluster.kubectl("get", "--raw", path, check=False)
        doc: Obj | None = json.loads(out) if out else None
        return doc if doc and doc.get("items") else None

    values = poll(served, timeout=120, interval=2, what="http_requests_per_second through the base's adapter")
    assert values["items"][0]["metricName"] == "http_requests_per_second"
    cluster.delete_apiservices()
    cluster.kubectl("delete", "-k", str(overlay), "--wait=false", check=False, timeout=120)
