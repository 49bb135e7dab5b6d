"""Side by side: our adapter vs prometheus-adapter v0.12.0 on the same Prometheus, cluster, rules and load.

Prints numbers, asserts nothing about time. `python -m tests.bench adapter_upstream` (the binary comes from
`make upstream-adapter`, the control plane from `make testbed`; `make bench` builds both first).

Setup, shared by both adapters:

* a real Prometheus (`LocalPrometheus`) backfilled with one `DCGM_FI_DEV_GPU_UTIL` gauge and one
  `http_requests_total` counter per pod (dcgm-exporter's `pod`/`namespace` labels), one sample every
  `STEP` seconds from a few minutes before the start of the run to `GPUWARDEN_BENCH_HORIZON_MIN` minutes after
  it. prometheus-adapter always queries at wall-clock "now", so the data has to be valid then: blocks reaching
  into the future are loaded by Prometheus like any other (no head, nothing scraped), and a check query at
  "now" must count every pod before anything is measured;
* a real control plane (`harness.testbed`, kwokctl binary runtime) holding PODS pods in NAMESPACES
  namespaces, HPAS apps of PODS/HPAS pods labelled `app=app-NNNN`. The pods name a scheduler that does not
  exist, so they stay Pending and cost no scheduler or kwok work: both adapters only need them as objects
  (prometheus-adapter LISTs them by label selector from the API server on every request, ours keeps a
  watch-backed index);
* the same prometheus-adapter `rules:` file for both (`RULES`; ours loads it unchanged through
  `adapter.rules_file`, with its built-in presets switched off so both serve exactly these two metrics):
  `gpu_utilization` (avg of DCGM_FI_DEV_GPU_UTIL per pod) and `http_requests_per_second` (rate over 2m of
  http_requests_total per pod); relist interval 60 s and metrics max age 5 m for both.

Each adapter runs alone (the other is stopped) as its own process, so every query Prometheus receives in the
window belongs to it. Both are called directly over HTTPS by the same aiohttp client, authenticated the same
way the aggregator does it: the testbed's front-proxy client certificate plus `X-Remote-User:
system:serviceaccount:kube-system:horizontal-pod-autoscaler` (requestheader authn from the
extension-apiserver-authentication ConfigMap, authz by SubjectAccessReview against a ClusterRole granted
here), so both pay the same authn/authz.

Load: HPA-shaped rounds, HPAS HPAs x 2 metrics, each request
`GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{metric}?labelSelector=app%3D{app}`, sent by
5 workers (kube-controller-manager's default `--concurrent-horizontal-pod-autoscaler-syncs`). One warm-up
round, then ROUNDS rounds started on the HPA cadence (one every 15 s; a round that takes longer is followed
at once by the next). Reported per adapter: requests/s and p50/p99 latency over the measured rounds, non-200
answers, and the queries Prometheus itself counted (`prometheus_http_requests_total` for /api/v1/query,
query_range, series, labels and label values, read from its /metrics before and after the measured rounds),
per round and per minute at one round per 15 s — which includes series discovery (relists) and, for ours,
the background refresh of its cache; RSS (VmRSS) and peak RSS (VmHWM) of each adapter process after the load;
seconds from process start to /readyz + discovery, and to the first 200 answer to an HPA request (the load
waits for the latter, in case an adapter reports ready before its pod index is synced — ours did until its
/readyz learnt to wait for its label caches; the two times are now equal for it).

Adaptations, stated: prometheus-adapter is started with `--client-qps`/`--client-burst` raised (client-go's
default of 5 QPS would otherwise throttle its per-request pod LIST to ~5 requests/s and its latency would
measure the throttle, not the adapter); apart from that and the shared relist interval / max age, both run
with their defaults (ours in its cache mode). Before measuring, a few HPAs' answers from both adapters are
compared value by value and the result is printed (a mismatch is reported, not hidden).

Knobs: GPUWARDEN_BENCH_PODS (10000), GPUWARDEN_BENCH_HPAS (1000) as in bench_adapter;
GPUWARDEN_BENCH_ROUNDS (4: one minute, so each window holds one relist of each adapter);
GPUWARDEN_BENCH_HORIZON_MIN (60: minutes of data after the start; the run must end before).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden import ports
from harness.localprom import LocalPrometheus, backfill_openmetrics
from harness.testbed import Cluster, ClusterConfig
from harness.testbed.binaries import repo_root
from tests.bench.bench_adapter import HPAS, NAMESPACES, POD_COUNT, WORKERS, pct, pods
from tests.bench.summary import record

ROUNDS = int(os.environ.get("GPUWARDEN_BENCH_ROUNDS", "4"))
HORIZON_MIN = int(os.environ.get("GPUWARDEN_BENCH_HORIZON_MIN", "60"))
STEP = 60
"""Seconds between backfilled samples: rate(...[2m]) always spans two, the gauge is at most 60 s old."""
CADENCE = 15.0
"""kube-controller-manager's default --horizontal-pod-autoscaler-sync-period."""
RELIST = "1m"
MAX_AGE = "5m"
CREATE_CONCURRENCY = 16
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
HPA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
METRICS = ("gpu_utilization", "http_requests_per_second")
QUERY_HANDLERS = (
    "/api/v1/query",
    "/api/v1/query_range",
    "/api/v1/series",
    "/api/v1/labels",
    "/api/v1/label/:name/values",
)
UPSTREAM_VERSION = "v0.12.0"

RULES = """\
rules:
- seriesQuery: 'DCGM_FI_DEV_GPU_UTIL{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name:
    matches: ^DCGM_FI_DEV_GPU_UTIL$
    as: gpu_utilization
  metricsQuery: avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
- seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name:
    matches: ^(.*)_total$
    as: ${1}_per_second
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)
"""

Fleet = list[tuple[str, str, str]]


# ------------------------------------------------------------------------------------------------ data
def history(fleet: Fleet, start: int, end: int) -> str:
    """OpenMetrics text: per pod a GPU-utilization gauge (n % 100), a counter growing n % 7 + 1 per second."""
    util = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    reqs = ["# TYPE http_requests counter"]
    for ts in range(start, end + 1, STEP):
        for n, (ns, pod, _) in enumerate(fleet):
            labels = f'pod="{pod}",namespace="{ns}"'
            util.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="node-{n // 8}",{labels}}} {n % 100} {ts}')
            reqs.append(f"http_requests_total{{{labels}}} {(ts - start) * (n % 7 + 1)} {ts}")
    return "\n".join(util + reqs) + "\n# EOF\n"


async def prom_scalar(session: aiohttp.ClientSession, url: str, query: str) -> float:
    async with session.get(f"{url}/api/v1/query", params={"query": query}) as response:
        body = await response.json()
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else math.nan


async def prom_query_counts(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Prometheus' own count of API requests per query handler (from its /metrics)."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    counts = dict.fromkeys(QUERY_HANDLERS, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name != "prometheus_http_requests":
            continue
        for sample in family.samples:
            handler = sample.labels.get("handler", "")
            if sample.name.endswith("_total") and handler in counts:
                counts[handler] += sample.value
    return counts


# ------------------------------------------------------------------------------------------------ cluster
@dataclass(frozen=True)
class AdminClient:
    """What it takes to call the API server as the kubeconfig's admin user."""

    server: str
    ssl_context: ssl.SSLContext


def admin_client(cluster: Cluster, workdir: Path) -> AdminClient:
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    user = doc["users"][0]["user"]
    base = cluster.kubeconfig.parent

    def path_of(key: str) -> str:
        if f"{key}-data" in user:
            target = workdir / f"admin-{key}.pem"
            target.write_bytes(base64.b64decode(user[f"{key}-data"]))
            return str(target)
        return str((base / user[key]).resolve())

    ctx = ssl.create_default_context(cafile=str(cluster.ca_cert))
    ctx.load_cert_chain(path_of("client-certificate"), path_of("client-key"))
    return AdminClient(cluster.server, ctx)


async def api_post(session: aiohttp.ClientSession, url: str, obj: dict[str, Any]) -> None:
    """POST with a few retries on throttling / transient errors; 409 (exists) is fine."""
    for attempt in range(6):
        async with session.post(url, json=obj) as response:
            if response.status in (200, 201, 409):
                return
            text = await response.text()
            if response.status not in (429, 500, 503, 504) and "serviceaccount" not in text.lower():
                raise RuntimeError(f"POST {url}: {response.status} {text[:300]}")
        await asyncio.sleep(0.2 * 2**attempt)
    raise RuntimeError(f"POST {url}: still failing after retries: {text[:300]}")


async def populate(admin: AdminClient, fleet: Fleet) -> None:
    """Namespaces, RBAC for the HPA's identity, then every pod, with bounded concurrency and progress."""
    connector = aiohttp.TCPConnector(ssl=admin.ssl_context, limit=CREATE_CONCURRENCY)
    async with aiohttp.ClientSession(admin.server, connector=connector) as session:
        started = time.perf_counter()
        for ns in sorted({ns for ns, _, _ in fleet}):
            await api_post(session, "/api/v1/namespaces", {"metadata": {"name": ns}})
        await api_post(
            session,
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "metadata": {"name": "bench-custom-metrics-reader"},
                "rules": [
                    {"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}
                ],
            },
        )
        await api_post(
            session,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": "bench-custom-metrics-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "bench-custom-metrics-reader",
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": "horizontal-pod-autoscaler",
                        "namespace": "kube-system",
                    }
                ],
            },
        )
        # The ServiceAccount admission plugin rejects pods until the namespace's "default" SA exists.
        namespaces = {ns for ns, _, _ in fleet}
        missing = namespaces
        for _ in range(240):
            async with session.get("/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault") as r:
                missing = namespaces - {i["metadata"]["namespace"] for i in (await r.json())["items"]}
            if not missing:
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"default ServiceAccounts still missing in {len(missing)} namespaces")
        print(f"  {len(namespaces)} namespaces + RBAC in {time.perf_counter() - started:.1f}s", flush=True)

        queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        for item in fleet:
            queue.put_nowait(item)
        done = 0
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                ns, pod, app = queue.get_nowait()
                body = {
                    "metadata": {"name": pod, "labels": {"app": app, "tier": "inference"}},
                    "spec": {
                        "schedulerName": "bench-nobody",  # stays Pending: no scheduler, no kwok work
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                    },
                }
                await api_post(session, f"/api/v1/namespaces/{ns}/pods", body)
                done += 1
                if done % 1000 == 0 or done == len(fleet):
                    rate = done / (time.perf_counter() - started)
                    print(f"  pods: {done}/{len(fleet)} ({rate:.0f}/s)", flush=True)

        await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))


# ------------------------------------------------------------------------------------------------ adapters
@dataclass
class AdapterProcess:
    """One adapter under test: how to start it, its pid and log."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.started = time.perf_counter()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB."""
        assert self.proc is not None
        fields: dict[str, float] = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
        return fields["VmRSS"], fields["VmHWM"]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running(adapter: AdapterProcess) -> Iterator[AdapterProcess]:
    adapter.start()
    try:
        yield adapter
    finally:
        adapter.stop()


def upstream_binary() -> Path:
    binary = repo_root() / ".cache" / "upstream" / "current" / "bin" / "adapter"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(
            f"{binary} missing: build it with `make upstream-adapter` (tests/bench/upstream/build.sh)"
        )
    return binary


def upstream_adapter(workdir: Path, cluster: Cluster, prom_url: str, rules: Path) -> AdapterProcess:
    port = ports.free_port("127.0.0.1")
    kubeconfig = str(cluster.kubeconfig)
    cert_dir = workdir / "upstream-certs"
    cert_dir.mkdir(exist_ok=True)
    argv = [
        str(upstream_binary()),
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={cert_dir}",
        f"--prometheus-url={prom_url}",
        f"--config={rules}",
        f"--metrics-relist-interval={RELIST}",
        f"--metrics-max-age={MAX_AGE}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--client-qps=1000",
        "--client-burst=2000",
        "--v=1",
    ]
    return AdapterProcess("prometheus-adapter", argv, port, workdir / "upstream.log")


def our_adapter(workdir: Path, cluster: Cluster, prom_url: str, rules: Path) -> AdapterProcess:
    port = ports.free_port("127.0.0.1")
    config = {
        "prometheus": {"url": prom_url},
        "adapter": {
            "bind_address": "127.0.0.1",
            "rules_file": str(rules),
            "relist_interval_seconds": 60,
            "metrics_max_age_seconds": 300,
            "presets": {
                "gpu_utilization": {"enabled": False},
                "gpu_memory_used_ratio": {"enabled": False},
                "requests_per_second": {"enabled": False},
            },
        },
    }
    path = workdir / "gpuwarden-adapter.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [
        sys.executable,
        "-m",
        "gpuwarden",
        "adapter",
        f"--config={path}",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--prometheus-url={prom_url}",
        f"--secure-port={port}",
        "--log-level=warning",
    ]
    return AdapterProcess("gpuwarden", argv, port, workdir / "gpuwarden-adapter.log")


@contextlib.asynccontextmanager
async def hpa_session(cluster: Cluster) -> AsyncIterator[aiohttp.ClientSession]:
    """The aggregator's identity: front-proxy client cert + the HPA controller's user in headers."""
    assert cluster.front_proxy is not None
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # both adapters serve self-signed certs here
    ctx.load_cert_chain(str(cluster.front_proxy.client_cert), str(cluster.front_proxy.client_key))
    headers = [("X-Remote-User", HPA_USER), *(("X-Remote-Group", g) for g in HPA_GROUPS)]
    connector = aiohttp.TCPConnector(ssl=ctx, limit=WORKERS)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
        yield session


async def wait_serving(
    session: aiohttp.ClientSession, adapter: AdapterProcess, probe: str, budget: float = 180
) -> tuple[float, float]:
    """Seconds from start until (a) /readyz is 200 and discovery lists both pod metrics, (b) `probe` is 200.

    (b) can come later than (a) if an adapter declares itself ready before its pod index is synced and
    answers 503 meanwhile (the HPA then keeps its scale); the load starts only after (b).
    """
    assert adapter.started is not None
    wanted = {f"pods/{m}" for m in METRICS}
    last = ""
    ready_at: float | None = None
    while time.perf_counter() - adapter.started < budget:
        if not adapter.alive():
            raise RuntimeError(f"{adapter.name} exited:\n{adapter.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            if ready_at is None:
                async with session.get(f"{adapter.base}/apis/custom.metrics.k8s.io/v1beta2") as response:
                    last = f"discovery {response.status} {(await response.text())[:200]}"
                    listed = (await response.json()).get("resources", []) if response.status == 200 else []
                    names = {r["name"] for r in listed}
                async with session.get(f"{adapter.base}/readyz") as ready:
                    if wanted <= names and ready.status == 200:
                        ready_at = time.perf_counter()
            if ready_at is not None:
                async with session.get(adapter.base + probe) as response:
                    last = f"{probe}: {response.status} {(await response.text())[:200]}"
                    if response.status == 200:
                        now = time.perf_counter()
                        return ready_at - adapter.started, now - adapter.started
        await asyncio.sleep(0.25)
    raise RuntimeError(f"{adapter.name} not serving {sorted(wanted)} after {budget:.0f}s (last: {last})")


def hpa_paths(fleet: Fleet) -> list[str]:
    apps = sorted({(ns, app) for ns, _, app in fleet})
    return [
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/%2A/{metric}?labelSelector=app%3D{app}"
        for ns, app in apps
        for metric in METRICS
    ]


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([numkMGTPE]|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity(text: str) -> float:
    """A Kubernetes resource.Quantity string as a float."""
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


async def sample_values(
    session: aiohttp.ClientSession, adapter: AdapterProcess, paths: list[str]
) -> dict[str, Any]:
    """path -> {pod: value} (or an error string), for the correctness check."""
    out: dict[str, Any] = {}
    for path in paths:
        async with session.get(adapter.base + path) as response:
            if response.status != 200:
                out[path] = f"HTTP {response.status}: {(await response.text())[:200]}"
                continue
            items = (await response.json())["items"]
        out[path] = {i["describedObject"]["name"]: quantity(i["value"]) for i in items}
    return out


@dataclass
class Result:
    name: str
    ready_s: float = 0.0
    answers_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=dict)
    elapsed: float = 0.0
    window: float = 0.0
    rounds: int = 0
    queries: dict[str, float] = field(default_factory=dict)
    rss_mib: float = 0.0
    hwm_mib: float = 0.0
    samples: dict[str, Any] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    @property
    def queries_per_round(self) -> float:
        return sum(self.queries.values()) / self.rounds if self.rounds else 0.0

    @property
    def queries_per_min(self) -> float:
        return self.queries_per_round * 60 / CADENCE


async def hpa_round(
    session: aiohttp.ClientSession, base: str, paths: list[str], result: Result | None
) -> float:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in paths:
        queue.put_nowait(p)

    async def worker() -> None:
        while not queue.empty():
            path = queue.get_nowait()
            started = time.perf_counter()
            try:
                async with session.get(base + path) as response:
                    await response.read()
                    status = response.status
            except (TimeoutError, aiohttp.ClientError):
                status = 0
            took = time.perf_counter() - started
            if result is not None:
                result.latencies.append(took)
                if status != 200:
                    result.errors[status] = result.errors.get(status, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return time.perf_counter() - started


async def measure(
    adapter: AdapterProcess,
    session: aiohttp.ClientSession,
    prom: aiohttp.ClientSession,
    prom_url: str,
    fleet: Fleet,
) -> Result:
    result = Result(adapter.name)
    paths = hpa_paths(fleet)
    result.ready_s, result.answers_s = await wait_serving(session, adapter, paths[0])
    print(
        f"  {adapter.name} (pid {adapter.pid}): /readyz and discovery OK {result.ready_s:.1f}s after start,"
        f" first HPA answer 200 after {result.answers_s:.1f}s",
        flush=True,
    )
    checks = [paths[0], paths[1], paths[len(paths) // 2], paths[len(paths) // 2 + 1], paths[-2], paths[-1]]
    result.samples = await sample_values(session, adapter, checks)
    took = await hpa_round(session, adapter.base, paths, None)
    print(f"  {adapter.name}: warm-up round of {len(paths)} requests in {took:.1f}s", flush=True)
    before = await prom_query_counts(prom, prom_url)
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
    after = await prom_query_counts(prom, prom_url)
    result.queries = {h: after[h] - before[h] for h in QUERY_HANDLERS if after[h] - before[h]}
    result.rounds = ROUNDS
    result.rss_mib, result.hwm_mib = adapter.rss_mib()
    return result


def compare(a: Result, b: Result) -> list[str]:
    """Mismatches between two adapters' sampled answers (empty: identical to 1e-6 relative)."""
    problems = []
    for path, va in a.samples.items():
        vb = b.samples.get(path)
        if isinstance(va, str) or isinstance(vb, str) or vb is None:
            problems.append(f"{path}: {a.name}={va!r} {b.name}={vb!r}")
            continue
        if set(va) != set(vb):
            problems.append(f"{path}: pods differ ({len(va)} vs {len(vb)})")
            continue
        for pod, x in va.items():
            if not math.isclose(x, vb[pod], rel_tol=1e-6, abs_tol=1e-9):
                problems.append(f"{path}: {pod} {a.name}={x} {b.name}={vb[pod]}")
    return problems


def report(results: list[Result], fleet: Fleet) -> None:
    per_app = max(1, POD_COUNT // HPAS)
    print(
        f"\nfleet: {len(fleet)} pods, {NAMESPACES} namespaces, {HPAS} HPAs x 2 metrics ({per_app} pods each),"
    )
    print(f"{WORKERS} workers, {ROUNDS} measured rounds on a {CADENCE:.0f}s cadence after a warm-up round;")
    print(f"relist every {RELIST} for both; queries counted by Prometheus during the measured rounds")
    header = (
        "adapter",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "prom q/round",
        "prom q/min",
        "RSS MiB",
        "peak MiB",
    )
    print("  ".join(f"{h:>18}" for h in header))
    for r in results:
        row = (
            r.name,
            f"{r.rps:.0f}",
            f"{pct(r.latencies, 0.5):.2f}",
            f"{pct(r.latencies, 0.99):.2f}",
            str(sum(r.errors.values())) + (f" {r.errors}" if r.errors else ""),
            f"{r.queries_per_round:.1f}",
            f"{r.queries_per_min:.1f}",
            f"{r.rss_mib:.0f}",
            f"{r.hwm_mib:.0f}",
        )
        print("  ".join(f"{c:>18}" for c in row))
    for r in results:
        detail = ", ".join(f"{h} {v:.0f}" for h, v in sorted(r.queries.items()))
        print(f"  {r.name}: Prometheus requests in the {r.window:.0f}s window: {detail or 'none'}")
        print(
            f"  {r.name}: ready {r.ready_s:.1f}s after start, first HPA answer 200 after {r.answers_s:.1f}s"
        )
    ours, upstream = results
    if ours.queries_per_min:
        print(
            f"Prometheus queries: {upstream.queries_per_min / ours.queries_per_min:.0f}x fewer with gpuwarden"
        )
    else:
        print("Prometheus queries: gpuwarden sent none in the window")
    p99_ours, p99_up = pct(ours.latencies, 0.99), pct(upstream.latencies, 0.99)
    print(
        f"p99 latency: gpuwarden {p99_ours:.2f} ms vs prometheus-adapter {p99_up:.2f} ms"
        f" ({p99_up / p99_ours if p99_ours else math.nan:.1f}x lower)"
    )
    print(f"requests/s: gpuwarden {ours.rps:.0f} vs prometheus-adapter {upstream.rps:.0f}")


def summarize(results: list[Result], bench: str, what: str, queries_goal: float, source: str) -> None:
    """The rows for the run summary, ours against prometheus-adapter in the same run (shared with
    bench_resource_upstream). Goals: `queries_goal` x fewer queries (stated in `source`); p99 and RSS
    from issue 29."""
    ours, upstream = results
    anchor = f"prometheus-adapter {UPSTREAM_VERSION}"
    q_ours, q_up = ours.queries_per_min, upstream.queries_per_min
    record(
        bench,
        f"{what}: Prometheus queries/min",
        q_ours,
        "queries/min",
        anchor=anchor,
        anchor_value=q_up,
        goal=f"≥ {queries_goal:.0f}x fewer ({source})",
        met=q_ours * queries_goal <= q_up,
    )
    p99_ours, p99_up = pct(ours.latencies, 0.99), pct(upstream.latencies, 0.99)
    record(
        bench,
        f"{what}: request p99",
        p99_ours,
        "ms",
        anchor=anchor,
        anchor_value=p99_up,
        goal="≤ 1/5 of the anchor's (issue 29)",
        met=p99_ours * 5 <= p99_up,
    )
    record(
        bench,
        f"{what}: requests/s, {WORKERS} workers",
        ours.rps,
        "req/s",
        anchor=anchor,
        anchor_value=upstream.rps,
    )
    record(
        bench,
        f"{what}: adapter RSS after the load",
        ours.rss_mib,
        "MiB",
        anchor=anchor,
        anchor_value=upstream.rss_mib,
        goal="≤ the anchor's (issue 29)",
        met=ours.rss_mib <= upstream.rss_mib,
    )


async def main() -> None:
    fleet = pods()
    now = int(time.time())
    start = (now - 300) // STEP * STEP
    end = now + HORIZON_MIN * 60
    binary = upstream_binary()
    with tempfile.TemporaryDirectory(prefix="bench-upstream-") as tmp:
        workdir = Path(tmp)
        rules = workdir / "prometheus-adapter-rules.yaml"
        rules.write_text(RULES)
        t0 = time.perf_counter()
        text = history(fleet, start, end)
        backfill_openmetrics(workdir / "prom", text, timeout=900)
        del text
        points = (end - start) // STEP + 1
        print(
            f"backfilled {len(fleet)} pods x 2 series x {points} points ({STEP}s apart, now-{now - start}s"
            f" .. now+{HORIZON_MIN}min) in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        async with LocalPrometheus(workdir / "prom") as prom, aiohttp.ClientSession() as prom_session:
            util = await prom_scalar(prom_session, prom.url, "count(DCGM_FI_DEV_GPU_UTIL)")
            rate = await prom_scalar(prom_session, prom.url, "count(rate(http_requests_total[2m]))")
            print(
                f"Prometheus at now: {util:.0f} GPU series, {rate:.0f} request rates (want {len(fleet)} each)"
            )
            if util != len(fleet) or rate != len(fleet):
                raise RuntimeError("Prometheus does not serve the backfilled data at wall-clock now")
            t0 = time.perf_counter()
            cluster = Cluster.create(ClusterConfig(name="bench-upstream", workdir=None))
            try:
                print(
                    f"cluster ready in {time.perf_counter() - t0:.1f}s; creating {len(fleet)} pods",
                    flush=True,
                )
                t0 = time.perf_counter()
                await populate(admin_client(cluster, workdir), fleet)
                print(f"populated in {time.perf_counter() - t0:.1f}s", flush=True)
                results = []
                async with hpa_session(cluster) as session:
                    for make in (our_adapter, upstream_adapter):
                        adapter = make(workdir, cluster, prom.url, rules)
                        with running(adapter):
                            results.append(await measure(adapter, session, prom_session, prom.url, fleet))
            finally:
                cluster.delete()
    problems = compare(results[0], results[1])
    checked = sum(len(v) for v in results[0].samples.values() if isinstance(v, dict))
    if problems:
        print(f"\ncorrectness: MISMATCH in {len(problems)} of the sampled answers:")
        for p in problems[:20]:
            print(f"  {p}")
    else:
        print(
            f"\ncorrectness: {len(results[0].samples)} sampled HPA requests, {checked} pod values identical"
        )
    print(f"prometheus-adapter {UPSTREAM_VERSION} binary: {binary}")
    report(results, fleet)
    summarize(results, "adapter_upstream", f"custom metrics, {len(fleet):,} pods", 500, "issue 29")
