"""metrics.k8s.io side by side: our adapter vs prometheus-adapter v0.12.0, kube-prometheus's config, one load.

Prints numbers, asserts nothing about time. `python -m tests.bench resource_upstream` (binary from `make
upstream-adapter`, control plane from `make testbed`). The machinery (processes, authentication as the
aggregator with the HPA controller's identity, Prometheus' own request counters, RSS) is
bench_adapter_upstream's; what differs:

* data: per pod a cAdvisor-shaped `container_cpu_usage_seconds_total` counter ((n % 7 + 1) x 10 millicores)
  and `container_memory_working_set_bytes` gauge ((n % 5 + 1) MiB), per node node-exporter-shaped
  `node_cpu_seconds_total` (2 cpus), `node_namespace_pod:kube_pod_info:` and MemTotal/MemAvailable,
  backfilled every STEP s around wall-clock now (prometheus-adapter always queries at now);
* cluster: NODES kwok nodes and PODS pods bound to them and Running (prometheus-adapter lists only Running
  pods), HPAS apps of PODS/HPAS pods in HPAS/10 namespaces;
* both adapters load kube-prometheus's adapter config file unchanged (tests/unit/golden/adapter/resource);
* load per 15 s round (HPA cadence), 5 workers: one `GET .../namespaces/{ns}/pods?labelSelector=app={app}`
  per HPA (kube-controller-manager's Resource-metric request), one cluster-wide `GET .../pods` (the VPA
  recommender), one `GET .../nodes` and one `GET .../namespaces/{ns}/pods` (`kubectl top`).

Knobs: GPUWARDEN_BENCH_PODS (10000), GPUWARDEN_BENCH_HPAS (1000), GPUWARDEN_BENCH_NODES (100),
GPUWARDEN_BENCH_ROUNDS (4), GPUWARDEN_BENCH_HORIZON_MIN (60).
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.localprom import LocalPrometheus, backfill_openmetrics
from harness.testbed import Cluster, ClusterConfig
from harness.testbed.binaries import repo_root
from tests.bench.bench_adapter import HPAS, NAMESPACES, WORKERS, pct, pods
from tests.bench.bench_adapter_upstream import (
    CADENCE,
    HORIZON_MIN,
    QUERY_HANDLERS,
    ROUNDS,
    UPSTREAM_VERSION,
    AdapterProcess,
    Fleet,
    Result,
    admin_client,
    api_post,
    hpa_round,
    hpa_session,
    our_adapter,
    prom_query_counts,
    prom_scalar,
    quantity,
    running,
    summarize,
    upstream_adapter,
    upstream_binary,
)

NODES = int(os.environ.get("GPUWARDEN_BENCH_NODES", "100"))
STEP = 60
"""Seconds between backfilled samples: kube-prometheus' irate(...[120s]) always finds the last two."""
NODE_STEP = 15
"""node-exporter's interval in kube-prometheus; its irate(...[60s]) needs two samples in a minute."""
CONFIG = repo_root() / "tests/unit/golden/adapter/resource/kube-prometheus-config.yaml"
API = "/apis/metrics.k8s.io/v1beta1"
CONCURRENCY = 16


def node_of(n: int) -> str:
    return f"node-{n % NODES:03d}"


def history(fleet: Fleet, start: int, end: int) -> str:
    cpu = ["# TYPE container_cpu_usage_seconds counter"]
    mem = ["# TYPE container_memory_working_set_bytes gauge"]
    idle = ["# TYPE node_cpu_seconds counter"]
    info = ["# TYPE node_namespace_pod:kube_pod_info: gauge"]
    total = ["# TYPE node_memory_MemTotal_bytes gauge"]
    avail = ["# TYPE node_memory_MemAvailable_bytes gauge"]
    for ts in range(start, end + 1, NODE_STEP):
        for n, (ns, pod, _) in enumerate(fleet if (ts - start) % STEP == 0 else []):
            labels = f'namespace="{ns}",pod="{pod}",container="app",job="kubelet"'
            cpu.append(
                f"container_cpu_usage_seconds_total{{{labels}}} {(ts - start) * (n % 7 + 1) / 100} {ts}"
            )
            mem.append(f"container_memory_working_set_bytes{{{labels}}} {(n % 5 + 1) * 2**20} {ts}")
        for k in range(NODES):
            node = node_of(k)
            exporter = f'namespace="monitoring",pod="node-exporter-{node}"'
            for c in ("0", "1"):
                idle.append(
                    f'node_cpu_seconds_total{{{exporter},instance="{node}",cpu="{c}",mode="idle"}} '
                    f"{(ts - start) * 0.5} {ts}"
                )
            info.append(f'node_namespace_pod:kube_pod_info:{{{exporter},node="{node}"}} 1 {ts}')
            job = f'job="node-exporter",instance="{node}"'
            total.append(f"node_memory_MemTotal_bytes{{{job}}} {8 * 2**30} {ts}")
            avail.append(f"node_memory_MemAvailable_bytes{{{job}}} {6 * 2**30} {ts}")
    return "\n".join(cpu + mem + idle + info + total + avail) + "\n# EOF\n"


async def populate(cluster: Cluster, workdir: Path, fleet: Fleet) -> None:
    """Nodes, namespaces, RBAC for the HPA's identity, the pods bound to the nodes; wait until all Run."""
    admin = admin_client(cluster, workdir)
    connector = aiohttp.TCPConnector(ssl=admin.ssl_context, limit=CONCURRENCY)
    async with aiohttp.ClientSession(admin.server, connector=connector) as session:
        for k in range(NODES):
            await api_post(
                session,
                "/api/v1/nodes",
                {
                    "metadata": {"name": node_of(k), "annotations": {"kwok.x-k8s.io/node": "fake"}},
                    "spec": {"taints": []},
                    "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "200"}},
                },
            )
        for ns in sorted({ns for ns, _, _ in fleet}):
            await api_post(session, "/api/v1/namespaces", {"metadata": {"name": ns}})
        role = {
            "metadata": {"name": "bench-resource-metrics-reader"},
            "rules": [
                {"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list"]}
            ],
        }
        await api_post(session, "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
        binding = {
            "metadata": {"name": "bench-resource-metrics-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "bench-resource-metrics-reader",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
            ],
        }
        await api_post(session, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        for _ in range(240):  # the ServiceAccount admission plugin needs each namespace's "default"
            async with session.get("/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault") as r:
                have = {i["metadata"]["namespace"] for i in (await r.json())["items"]}
            if {ns for ns, _, _ in fleet} <= have:
                break
            await asyncio.sleep(0.5)
        queue: asyncio.Queue[tuple[int, tuple[str, str, str]]] = asyncio.Queue()
        for item in enumerate(fleet):
            queue.put_nowait(item)
        started = time.perf_counter()

        async def worker() -> None:
            while not queue.empty():
                n, (ns, pod, app) = queue.get_nowait()
                body = {
                    "metadata": {"name": pod, "labels": {"app": app}},
                    "spec": {
                        "nodeName": node_of(n),
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                    },
                }
                await api_post(session, f"/api/v1/namespaces/{ns}/pods", body)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        print(
            f"  {len(fleet)} pods on {NODES} nodes created in {time.perf_counter() - started:.1f}s",
            flush=True,
        )
        for _ in range(1200):
            async with session.get("/api/v1/pods?fieldSelector=status.phase%21%3DRunning&limit=1") as r:
                body = await r.json()
            if not body["items"]:
                break
            await asyncio.sleep(1)
        else:
            raise RuntimeError("pods still not Running after 20 min")
        print(f"  all Running after {time.perf_counter() - started:.1f}s (kwok)", flush=True)


def load_paths(fleet: Fleet) -> list[str]:
    apps = sorted({(ns, app) for ns, _, app in fleet})
    paths = [f"{API}/namespaces/{ns}/pods?labelSelector=app%3D{app}" for ns, app in apps]
    return [*paths, f"{API}/pods", f"{API}/nodes", f"{API}/namespaces/{apps[0][0]}/pods"]


async def wait_answering(session: aiohttp.ClientSession, adapter: AdapterProcess, path: str) -> float:
    assert adapter.started is not None
    last = ""
    while time.perf_counter() - adapter.started < 300:
        if not adapter.alive():
            raise RuntimeError(f"{adapter.name} exited:\n{adapter.log_tail()}")
        try:
            async with session.get(adapter.base + path) as response:
                body = await response.text()
                last = f"{response.status} {body[:200]}"
                if response.status == 200 and '"containers"' in body:
                    return time.perf_counter() - adapter.started
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{adapter.name} never answered {path}: {last}")


async def sample(session: aiohttp.ClientSession, adapter: AdapterProcess, paths: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in paths:
        async with session.get(adapter.base + path) as response:
            if response.status != 200:
                out[path] = f"HTTP {response.status}"
                continue
            items = (await response.json())["items"]
        out[path] = {
            i["metadata"]["name"]: tuple(
                sum(quantity(c["usage"][k]) for c in i["containers"])
                if "containers" in i
                else quantity(i["usage"][k])
                for k in ("cpu", "memory")
            )
            for i in items
        }
    return out


async def measure(
    adapter: AdapterProcess,
    session: aiohttp.ClientSession,
    prom: aiohttp.ClientSession,
    url: str,
    fleet: Fleet,
) -> Result:
    result = Result(adapter.name)
    paths = load_paths(fleet)
    result.answers_s = await wait_answering(session, adapter, paths[0])
    print(f"  {adapter.name} (pid {adapter.pid}): first PodMetrics after {result.answers_s:.1f}s", flush=True)
    result.samples = await sample(session, adapter, [paths[0], paths[len(paths) // 2], paths[-2]])
    took = await hpa_round(session, adapter.base, paths, None)
    print(f"  {adapter.name}: warm-up round of {len(paths)} requests in {took:.1f}s", flush=True)
    before = await prom_query_counts(prom, url)
    window_start = time.perf_counter()
    for k in range(ROUNDS):
        delay = window_start + k * CADENCE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        took = await hpa_round(session, adapter.base, paths, result)
        result.elapsed += took
        print(f"  {adapter.name}: round {k + 1}/{ROUNDS}: {len(paths)} requests in {took:.1f}s", flush=True)
    delay = window_start + ROUNDS * CADENCE - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    result.window = time.perf_counter() - window_start
    after = await prom_query_counts(prom, url)
    result.queries = {h: after[h] - before[h] for h in QUERY_HANDLERS if after[h] - before[h]}
    result.rounds = ROUNDS
    result.rss_mib, result.hwm_mib = adapter.rss_mib()
    return result


def compare(ours: Result, upstream: Result) -> list[str]:
    """Differences beyond prometheus-adapter's truncation to whole millicores."""
    problems = []
    for path, mine in ours.samples.items():
        theirs = upstream.samples.get(path)
        if isinstance(mine, str) or isinstance(theirs, str) or theirs is None:
            problems.append(f"{path}: ours={mine!r} theirs={theirs!r}")
            continue
        if set(mine) != set(theirs):
            problems.append(f"{path}: objects differ ({len(mine)} vs {len(theirs)})")
            continue
        for name, (cpu, memory) in mine.items():
            if abs(cpu - theirs[name][0]) > 0.0011 or not math.isclose(memory, theirs[name][1], rel_tol=1e-9):
                problems.append(f"{path}: {name} ours={mine[name]} theirs={theirs[name]}")
    return problems


def report(results: list[Result], fleet: Fleet) -> None:
    paths = len(load_paths(fleet))
    print(
        f"\nfleet: {len(fleet)} Running pods on {NODES} nodes, {NAMESPACES} namespaces, "
        f"{HPAS} Resource-metric HPAs;"
    )
    print(
        f"per round ({CADENCE:.0f}s cadence, {WORKERS} workers): {paths} requests = {HPAS} HPA "
        "+ VPA + top nodes + top pods"
    )
    print(
        f"{'adapter':>20} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>8} {'q/round':>9} "
        f"{'q/min':>9} {'RSS MiB':>8} {'peak':>8}"
    )
    for r in results:
        print(
            f"{r.name:>20} {r.rps:>8.0f} {pct(r.latencies, 0.5):>8.2f} {pct(r.latencies, 0.99):>8.2f}"
            f" {sum(r.errors.values()):>8} {r.queries_per_round:>9.1f} {r.queries_per_min:>9.1f}"
            f" {r.rss_mib:>8.0f} {r.hwm_mib:>8.0f}"
        )
        if r.errors:
            print(f"  {r.name}: non-200 answers {r.errors}")
    ours, upstream = results
    ratio = upstream.queries_per_min / ours.queries_per_min if ours.queries_per_min else math.inf
    print(f"Prometheus queries: {ratio:.0f}x fewer with gpuwarden (goal >= 100x)")
    p99_ours, p99_up = pct(ours.latencies, 0.99), pct(upstream.latencies, 0.99)
    print(
        f"p99 latency: gpuwarden {p99_ours:.2f} ms vs prometheus-adapter {p99_up:.2f} ms "
        f"({p99_up / p99_ours:.1f}x lower)"
    )


async def main() -> None:
    fleet = pods()
    now = int(time.time())
    start = (now - 300) // STEP * STEP
    end = now + HORIZON_MIN * 60
    binary = upstream_binary()
    with tempfile.TemporaryDirectory(prefix="bench-resource-") as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        backfill_openmetrics(workdir / "prom", history(fleet, start, end), timeout=1200)
        print(
            f"backfilled {len(fleet)} pods and {NODES} nodes, {STEP}s apart, "
            f"in {time.perf_counter() - t0:.1f}s"
        )
        async with LocalPrometheus(workdir / "prom") as prom, aiohttp.ClientSession() as prom_session:
            count = await prom_scalar(prom_session, prom.url, "count(container_memory_working_set_bytes)")
            if count != len(fleet):
                raise RuntimeError(f"Prometheus serves {count} pods at now, want {len(fleet)}")
            cluster = Cluster.create(ClusterConfig(name="bench-resource", workdir=None))
            try:
                t0 = time.perf_counter()
                await populate(cluster, workdir, fleet)
                print(f"populated in {time.perf_counter() - t0:.1f}s", flush=True)
                results = []
                async with hpa_session(cluster) as session:
                    for make in (our_adapter, upstream_adapter):
                        adapter = make(workdir, cluster, prom.url, CONFIG)
                        with running(adapter):
                            results.append(await measure(adapter, session, prom_session, prom.url, fleet))
            finally:
                cluster.delete()
    problems = compare(results[0], results[1])
    if problems:
        print(f"\ncorrectness: {len(problems)} differences in the sampled answers:")
        for p in problems[:10]:
            print(f"  {p}")
    else:
        checked = sum(len(v) for v in results[0].samples.values() if isinstance(v, dict))
        print(
            f"\ncorrectness: {checked} sampled pods and nodes agree "
            "(cpu within prometheus-adapter's 1m truncation)"
        )
    print(f"prometheus-adapter {UPSTREAM_VERSION} binary: {binary}")
    report(results, fleet)
    summarize(results, "resource_upstream", f"metrics.k8s.io, {len(fleet):,} pods", 100, "this bench")
