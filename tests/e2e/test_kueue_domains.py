"""Kueue Topology Aware Scheduling places whole jobs into one NVLink domain; gpuwarden's published domain
health steers it off a degraded one (issue 49).

The real Kueue manager (v0.17.0, built by `make kueue`; its CRDs from the same module) runs as a local process
against the test bed with TAS on, a Topology of two levels (`nvidia.com/gpu.clique` →
`kubernetes.io/hostname`) and one ResourceFlavor over a private pool of kwok trays shaped as two GB200 NVL72
racks (2 cliques x 18 trays x 4 GPUs). kube-scheduler calls gpuwarden's extender (filter, prioritize, bind)
for every pod Kueue ungates, so each pod's GPUs are recorded by our bind. Domain health is published by the
real health loop (`HealthLoop`: observe, decide, act) from simulated DCGM series of the same trays scraped by
a real Prometheus, with one tray's NVLinks taken down through the simulator's control API.

The jobs carry what docs/health.md "How the schedulers read it" tells operators to give multi-node jobs: a
required node affinity `gpuwarden.io/nvlink-domain-health DoesNotExist` (TAS honours it because hostname is
the lowest level, ../shared/reference/autoscalers-and-domains.md §B.2).

Webhooks: none registered. Kueue's webhooks only default and validate here (a Job is created suspended by its
mutating webhook; the Jobs below are created suspended with their queue label, as that webhook would leave
them), so the manager runs with its webhook server up on 127.0.0.1 (a certificate of our own CA) but no
Mutating/ValidatingWebhookConfiguration points at it: nothing in the shared test bed depends on a webhook
of this module. Kueue v0.17.0 without internal certificate management insists on the hard-coded
/etc/kueue/metrics/certs; the manager gets them in a private mount namespace (`unshare --mount`, a tmpfs
over /etc for that process only), so nothing is written outside the test's directory.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.health.loop import HealthLoop
from controller.health.plan import HealthPlan
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import NVLINK_DOMAIN_HEALTH, TOPOLOGY_POLICY
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from harness.simulator import racks as nvl72
from harness.testbed import Cluster, add_gpu_nodes, delete_nodes, ensure_namespace, poll
from harness.testbed.nodes import nvl72_node_specs
from harness.testbed.pki import issue, make_ca
from tests.e2e.conftest import free_port, gpuwarden_extender, repo_path, scheduler_calling
from tests.e2e.test_extender_scheduler import PREFIX, RunningExtender

pytestmark = pytest.mark.e2e

SUFFIX = uuid.uuid4().hex[:5]
POOL = f"kq-{SUFFIX}"
PREFIX_TRAYS = f"kq{SUFFIX}-"
TRAYS = nvl72.trays(2, PREFIX_TRAYS)
CLIQUES = [nvl72.clique(0), nvl72.clique(1)]
NS = f"kueue-e2e-{SUFFIX}"
HEALTH_NS = f"kueue-health-{SUFFIX}"
KUEUE_NS = "kueue-system"
POOL_TAINT = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
TOPOLOGY, FLAVOR, CQ, LQ = f"nvl72-{SUFFIX}", f"gb200-{SUFFIX}", f"cq-{SUFFIX}", "nvl72"
PODS_PER_JOB, GPUS_PER_POD = 16, 4
KUEUE_MODULE = "sigs.k8s.io/kueue@v0.17.0"  # under `go env GOMODCACHE`, where `make kueue` downloaded it


def module_cache() -> Path:
    go = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
    out = go.stdout.strip()
    return Path(out) if out else Path.home() / "go" / "pkg" / "mod"


def kueue_binary() -> Path:
    path = repo_path(".cache", "kueue", "current", "bin", "kueue")
    if not path.exists():
        pytest.fail(f"{path} missing: run `make kueue` first (under the heavy lock)", pytrace=False)
    return path


def kueue_crds() -> Path:
    crds = module_cache() / KUEUE_MODULE / "config" / "components" / "crd" / "bases"
    if not crds.is_dir():
        pytest.fail(f"{crds} missing: `make kueue` downloads the module", pytrace=False)
    return crds


@pytest.fixture(scope="module")
def trays(cluster: Cluster) -> Iterator[list[str]]:
    # a GB200 compute tray: two Grace CPUs (NUMA nodes) of 2 GPUs each, every GPU on the rack's NVLink fabric
    tray = {
        str(g): {"numa": g // 2, "pcie": f"pci{g}", "nvlink": "nvl72"} for g in range(nvl72.GPUS_PER_TRAY)
    }
    labels = {"gpuwarden.io/e2e-pool": POOL}
    specs = nvl72_node_specs(2, PREFIX_TRAYS, labels=labels, taints=[POOL_TAINT], topology=tray)
    names = add_gpu_nodes(cluster, specs)
    try:
        yield names
    finally:
        delete_nodes(cluster, names)


@pytest.fixture(scope="module")
def extender(cluster: Cluster, trays: list[str]) -> Iterator[RunningExtender]:
    port = free_port()
    running = RunningExtender(cluster, port).start()
    try:
        with scheduler_calling(cluster, gpuwarden_extender(port, PREFIX)):
            yield running
    finally:
        running.stop()


def kueue_config(workdir: Path, certs: Path) -> tuple[Path, int]:
    health = free_port()
    doc = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NS,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"]},
    }
    path = workdir / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, health


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, trays: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    binary, crds = kueue_binary(), kueue_crds()
    if shutil.which("unshare") is None:
        pytest.fail(
            "unshare (util-linux) is needed to give Kueue its metrics certificate path", pytrace=False
        )
    workdir = tmp_path_factory.mktemp("kueue")
    cluster.kubectl("apply", "--server-side", "-f", str(crds), timeout=120)
    ensure_namespace(cluster, KUEUE_NS)
    certs = workdir / "certs"
    ca = make_ca("gpuwarden-e2e-kueue-ca")
    issue(ca, "kueue", dns_names=("localhost",), ip_addresses=("127.0.0.1",), server=True).write(certs, "tls")
    config, health = kueue_config(workdir, certs)
    script = (
        'mount -t tmpfs tmpfs /etc && mkdir -p /etc/kueue/metrics/certs && cp "$0"/tls.crt "$0"/tls.key '
        '/etc/kueue/metrics/certs/ && exec "$1" --config "$2" --kubeconfig "$3" '
        "--feature-gates VisibilityOnDemand=false"
    )
    log = (workdir / "kueue.log").open("wb")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
         str(certs), str(binary), str(config), str(cluster.kubeconfig)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"Kueue exited {proc.returncode}:\n{tail(workdir / 'kueue.log')}")
        try:
            return httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll(ready, timeout=90, what="Kueue manager ready")
        apply_queues(cluster)
        yield
    finally:
        cluster.kubectl(
            "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=120, check=False
        )
        for kind, name in (("clusterqueue", CQ), ("resourceflavor", FLAVOR), ("topology", TOPOLOGY)):
            cluster.kubectl("delete", f"{kind}.kueue.x-k8s.io", name, "--ignore-not-found", check=False)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        print(f"\n[kueue] manager log tail:\n{tail(workdir / 'kueue.log', 15)}")


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def apply_queues(cluster: Cluster) -> None:
    ensure_namespace(cluster, NS)
    api = "kueue.x-k8s.io/v1beta2"
    toleration = {"key": POOL_TAINT["key"], "operator": "Equal", "value": POOL, "effect": "NoSchedule"}
    cluster.apply(
        {"apiVersion": api, "kind": "Topology", "metadata": {"name": TOPOLOGY},
         "spec": {"levels": [{"nodeLabel": nvl72.CLIQUE_LABEL}, {"nodeLabel": "kubernetes.io/hostname"}]}},
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
         "spec": {"nodeLabels": {"gpuwarden.io/e2e-pool": POOL}, "topologyName": TOPOLOGY,
                  "tolerations": [toleration]}},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": CQ},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                      "flavors": [{"name": FLAVOR, "resources": [
                                          {"name": "cpu", "nominalQuota": "100"},
                                          {"name": "memory", "nominalQuota": "100Gi"},
                                          {"name": "nvidia.com/gpu", "nominalQuota": "144"}]}]}]}},
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": LQ, "namespace": NS},
         "spec": {"clusterQueue": CQ}},
    )  # fmt: skip

    def active() -> bool:
        cq = cluster.get_json("clusterqueue.kueue.x-k8s.io", CQ)
        conds = {c["type"]: c["status"] for c in cq.get("status", {}).get("conditions", [])}
        return conds.get("Active") == "True"

    poll(active, timeout=30, what="ClusterQueue active")


def job(name: str) -> dict[str, Any]:
    """A 16-pod Job of 4-GPU pods for the LocalQueue, required inside one clique, kept off degraded domains;
    created suspended (what Kueue's Job webhook would do)."""
    resources = {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(GPUS_PER_POD)}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": NVLINK_DOMAIN_HEALTH, "operator": "DoesNotExist"}]}]}}}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": LQ}},
        "spec": {
            "suspend": True,
            "parallelism": PODS_PER_JOB,
            "completions": PODS_PER_JOB,
            "template": {
                "metadata": {
                    "annotations": {
                        "kueue.x-k8s.io/podset-required-topology": nvl72.CLIQUE_LABEL,
                        # 4 GPUs span a tray's two NUMA nodes: the default single-numa would refuse every tray
                        TOPOLOGY_POLICY: "prefer-numa",
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "registry.invalid/gpuwarden/e2e:0",
                                    "resources": {"requests": resources, "limits": resources}}],
                    "tolerations": [{"key": POOL_TAINT["key"], "operator": "Equal", "value": POOL}],
                    "affinity": affinity,
                },
            },
        },
    }  # fmt: skip


def job_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    items = cluster.get_json("pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={name}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def run_job(cluster: Cluster, name: str, timeout: float = 120) -> dict[str, str]:
    """Submit the Job, wait until Kueue admitted it and every pod is bound; pod -> node. Each pod's GPUs
    are the 4 our bind recorded, none twice on a node."""
    cluster.apply(job(name))
    clique_of = dict(TRAYS)

    def bound() -> bool:
        items = job_pods(cluster, name)
        return len(items) == PODS_PER_JOB and all(p["spec"].get("nodeName") for p in items)

    try:
        poll(bound, timeout=timeout, what=f"job {name}: {PODS_PER_JOB} pods bound")
    except Exception as exc:
        workloads = cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", NS, "-o", "yaml", check=False)
        pods = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["spec"].get("schedulingGates"),
                 [c.get("message") for c in p.get("status", {}).get("conditions", [])])
                for p in job_pods(cluster, name)]  # fmt: skip
        raise AssertionError(f"{exc}\npods: {pods}\nworkloads:\n{workloads[-3000:]}") from None
    placed: dict[str, str] = {}
    held: Counter[tuple[str, str]] = Counter()
    for p in job_pods(cluster, name):
        node = p["spec"]["nodeName"]
        assert node in clique_of, f"{p['metadata']['name']} on {node}, outside the NVL72 pool"
        ids = (p["metadata"].get("annotations") or {}).get("gpuwarden.io/gpu-ids", "").split(",")
        assert len(set(ids)) == GPUS_PER_POD and "" not in ids, (p["metadata"]["name"], ids)
        held.update((node, i) for i in ids)
        assert not p["spec"].get("schedulingGates"), "bound while still gated"
        placed[p["metadata"]["name"]] = node
    assert max(held.values()) == 1, f"a GPU recorded twice: {held.most_common(3)}"
    return placed


def single_tray_pod(name: str, clique: str) -> dict[str, Any]:
    """A 4-GPU pod of no job and no queue, kept inside `clique` (Kueue leaves it alone)."""
    resources = {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(GPUS_PER_POD)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": {TOPOLOGY_POLICY: "prefer-numa"}},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {nvl72.CLIQUE_LABEL: clique},
            "containers": [{"name": "main", "image": "registry.invalid/gpuwarden/e2e:0",
                            "resources": {"requests": resources, "limits": resources}}],
            "tolerations": [{"key": POOL_TAINT["key"], "operator": "Equal", "value": POOL}],
        },
    }  # fmt: skip


def bound_node(cluster: Cluster, name: str, timeout: float = 60) -> str:
    """The node `name` was bound to, once its GPUs are recorded."""

    def node() -> str:
        pod = cluster.get_json("pods", "-n", NS, name)
        ids = (pod["metadata"].get("annotations") or {}).get("gpuwarden.io/gpu-ids", "")
        return str(pod["spec"].get("nodeName") or "") if len(ids.split(",")) == GPUS_PER_POD else ""

    poll(lambda: bool(node()), timeout=timeout, what=f"pod {name} bound with {GPUS_PER_POD} GPUs recorded")
    return node()


def cliques_of(placed: dict[str, str]) -> set[str]:
    clique_of = dict(TRAYS)
    return {clique_of[n] for n in placed.values()}


def delete_job(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "job", name, "-n", NS, "--cascade=foreground", "--wait=true", timeout=120)
    poll(lambda: not job_pods(cluster, name), timeout=60, what=f"job {name}'s pods gone")


def published(cluster: Cluster) -> dict[str, str]:
    out = {}
    for item in cluster.get_json("nodes", "-l", f"gpuwarden.io/e2e-pool={POOL}")["items"]:
        value = (item["metadata"].get("labels") or {}).get(NVLINK_DOMAIN_HEALTH)
        if value:
            out[item["metadata"]["name"]] = value
    return out


def health_config(cluster: Cluster, prom_url: str) -> Config:
    return Config.model_validate(
        {
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "namespace": HEALTH_NS},
            "prometheus": {"url": prom_url},
            "health": {
                "loop_interval_seconds": 1,
                "max_sample_age_seconds": 10,
                "healthy_period_seconds": 3,
                "breaker": {"max_absolute": 10},
                # the trays became Ready a minute ago: a 1 s boot grace, or their signals would be held
                "signals": {"window_seconds": 30, "boot_grace_seconds": 1},
            },
        }
    )


async def passes_until(hl: HealthLoop, done: Callable[[HealthPlan], bool], within: float = 60) -> HealthPlan:
    """The loop's passes (observe, decide, act), 1 s apart, until `done(plan)`."""
    deadline = time.monotonic() + within
    while True:
        plan = await hl.run_once()
        if done(plan):
            return plan
        if time.monotonic() > deadline:
            kinds = Counter(a.kind for a in plan.actions)
            raise AssertionError(
                f"not reached in {within}s; last plan: domains {plan.domains}, actions {kinds}, "
                f"gpu_nodes {plan.gpu_nodes}, healthy {plan.healthy}, breaker {plan.breaker.to_dict()}, "
                f"signals {plan.signals[:12]}, absent {plan.absent_series}"
            )
        await asyncio.sleep(1)


@pytest.fixture(scope="module")
def first_job(cluster: Cluster, trays: list[str], extender: RunningExtender, kueue: None) -> dict[str, str]:
    """Both racks healthy: the first job's placement (pod -> node); the job is deleted again."""
    t0 = time.monotonic()
    placed = run_job(cluster, "train-a")
    print(f"\n[kueue-e2e] first job admitted and every pod bound in {time.monotonic() - t0:.1f}s")
    delete_job(cluster, "train-a")
    return placed


def test_kueue_admits_a_16_pod_job_into_one_clique_and_the_extender_binds_every_pod(
    first_job: dict[str, str],
) -> None:
    assert len(first_job) == PODS_PER_JOB
    assert len(set(first_job.values())) == PODS_PER_JOB  # one 4-GPU pod per tray
    assert len(cliques_of(first_job)) == 1, f"job spread over cliques: {Counter(first_job.values())}"


async def test_kueue_avoids_the_clique_health_published_degraded_and_recovery_releases_it(
    cluster: Cluster, first_job: dict[str, str], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    (chosen,) = cliques_of(first_job)
    other = next(c for c in CLIQUES if c != chosen)
    # 1. One tray of the clique Kueue chose loses its NVLinks; the real health loop publishes its domain.
    ensure_namespace(cluster, HEALTH_NS)
    sim = await start(parse_scenario(nvl72.scenario(2, PREFIX_TRAYS, exporter={"tick": 0.5})))
    target = scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1)
    prom = LocalPrometheus(tmp_path / "prom", [target])
    members = {n for n, c in TRAYS if c == chosen}
    down = sorted(members)[3]
    try:
        await prom.start()
        await prom.wait_for_up("dcgm")
        config = health_config(cluster, prom.url)
        async with (
            PrometheusClient(config.prometheus) as promclient,
            KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube,
        ):
            hl = HealthLoop(config, promclient, kube, registry=CollectorRegistry())
            watcher = asyncio.create_task(hl.informer.run())
            try:
                await asyncio.wait_for(hl.informer.synced.wait(), 30)
                async with httpx.AsyncClient() as http:
                    faults = nvl72.nvlinks_down(down)
                    (await http.post(f"{sim.url}/control/faults", json=faults)).raise_for_status()
                await passes_until(hl, lambda p: bool(p.actions_of("domain-degrade")))
                assert published(cluster) == dict.fromkeys(members, "degraded")
                t_degraded = time.monotonic() - t0

                # 2. The next job goes to the other clique: Kueue honours what health published (the state in
                # which it chose `chosen` for the first job, but for the label).
                second = await asyncio.to_thread(run_job, cluster, "train-b")
                assert cliques_of(second) == {other}, Counter(second.values())

                # 2b. Single-tray work (no job, no queue) still runs on a healthy tray of the degraded clique:
                # the domain refuses only pods of a multi-pod job.
                solo = single_tray_pod("solo", chosen)
                cluster.apply(solo)
                node = await asyncio.to_thread(bound_node, cluster, "solo")
                assert node in members and node != down, (node, down)
                cluster.kubectl("delete", "pod", "solo", "-n", NS, "--wait=true", timeout=60)

                # 3. The fault clears; the loop releases the domain and a third job (the other clique now
                # holds 16 of its 18 trays) is admitted into the recovered one.
                async with httpx.AsyncClient() as http:
                    clear = await http.request("DELETE", f"{sim.url}/control/faults", json={"node": down})
                    clear.raise_for_status()
                await passes_until(hl, lambda p: bool(p.actions_of("domain-release")))
                assert published(cluster) == {}
                third = await asyncio.to_thread(run_job, cluster, "train-c")
                assert cliques_of(third) == {chosen}, Counter(third.values())
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
    finally:
        await prom.stop()
        await sim.stop()
        cluster.kubectl("delete", "namespace", HEALTH_NS, "--ignore-not-found", "--wait=false", check=False)
    print(f"\n[kueue-e2e] degraded published after {t_degraded:.1f}s; scenario {time.monotonic() - t0:.1f}s")
