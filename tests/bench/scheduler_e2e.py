"""End-to-end part of `bench_extender`: pods/s of the real kube-scheduler on a kwok GPU fleet, without and
with gpuwarden's extender (filter + prioritize + bind, nodeCacheCapable), and where the time goes.

One cluster (`quiet_fleet_config`: long kwok leases, so 5,000 fake nodes do not keep the API server busy),
one fleet of 8-GPU nodes (2 NUMA x 4, NVLink pairs, the `gpuwarden.io/gpu-topology` annotation), then per
mode: a fresh namespace, the pods created by a few concurrent `kubectl create`, a `kubectl --watch` that
tells when every pod has a node, and the clock from the first create to the last bound pod - each pod's bind
moment taken from kube-scheduler's `Scheduled` event (its `eventTime` has microseconds; the watch's own
stamps are kept only if events are missing, as kubectl's watch can stall under load and stamp late). The
first run's pods are deleted before the second, so both see an empty fleet. Both runs use the same
KubeSchedulerConfiguration apart from `extenders` (the same `percentageOfNodesToScore`).

The extender runs as its own process (`tests.bench.extender_process`), built as the controller builds it;
its Prometheus latency histogram and kube-scheduler's own /metrics say where the time goes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden import ports
from harness.testbed import (
    Cluster,
    ClusterConfig,
    ClusterError,
    ExtenderSpec,
    GpuNodeSpec,
    SchedulerSettings,
    ensure_namespace,
    scheduler_configuration,
)
from harness.testbed.fleet import create_fleet, quiet_fleet_config
from tests.bench.summary import record

PREFIX = "/gpuwarden"
PROTOCOLS = tuple(os.environ.get("GPUWARDEN_BENCH_E2E_PROTOCOLS", "leader,claim").split(","))
"""The extender's bind protocols to run, each in both kinds: `leader` (one write per pod, opt-in)
is the one the summary's goal rows judge; `claim` (claim PATCH + verify + Binding) is reported beside it."""
BIND = os.environ.get("GPUWARDEN_BENCH_E2E_BIND", "1") != "0"
"""`GPUWARDEN_BENCH_E2E_BIND=0`: the extender filters and scores but the scheduler binds (where time goes)."""
OVERLOAD = os.environ.get("GPUWARDEN_BENCH_E2E_OVERLOAD", "1s")
"""The overload run (issue 47): the backlog again, for the null extender and each protocol, with the
scheduler's extender httpTimeout cut to this (and the extender told so), i.e. the machine too slow for the
scheduler's patience; "" or "0" skips it."""
SIZES = (1, 1, 2, 4, 1, 2, 8, 1)
"""GPUs per pod, cycled: mean 2.5 GPUs a pod."""
CREATORS = 8
"""Concurrent `kubectl create` processes for the pod stream."""


def topology(numa: int, per_numa: int) -> dict[str, Any]:
    """The `gpuwarden.io/gpu-topology` annotation of one node: NUMA, PCIe switch and NVLink pair per GPU."""
    return {
        str(i): {
            "numa": i // per_numa,
            "pcie": f"pci{i // 2}",
            "nvlink": f"nvl{i // 2}",
            "uuid": f"GPU-b-{i}",
        }
        for i in range(numa * per_numa)
    }


def pod_body(name: str, namespace: str, gpus: int) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "bench"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/gpuwarden/bench:0",
                    "resources": {"limits": limits},
                }
            ]
        },
    }


@dataclass
class RunResult:
    mode: str
    kind: str
    """stream: pods created while the scheduler runs; backlog: all pods pending, then the scheduler starts."""
    pods: int
    created_s: float
    """First create to last create returned."""
    total_s: float
    """stream: first create to last pod bound; backlog: scheduler (re)start to last pod bound."""
    spread_s: float
    """First pod bound to last pod bound."""
    bound: int
    extender: dict[str, str] = field(default_factory=dict)
    scheduler: dict[str, str] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)
    api: str = ""
    """kube-apiserver requests during the run (pods, events, leases, nodes)."""
    cpu: str = ""
    """CPU time per bound pod of each process during the run, and how busy the machine's cores were."""
    cpu_ms: dict[str, float] = field(default_factory=dict)
    """The same per process, as numbers (ms per bound pod)."""
    bindings: dict[str, float] = field(default_factory=dict)
    """kube-apiserver's pods/binding POSTs during the run by HTTP code (201 created, 409 already bound)."""
    bind_requests: float = 0.0
    """Bind requests the scheduler sent the extender (gpuwarden only: its counter; retries included)."""
    binds_started: float = 0.0
    """Bind requests that started a bind of their own (not joined to a running one, not shed)."""
    events: str = ""
    """GPUsAssigned Events written vs. binds (gpuwarden only)."""

    @property
    def pods_per_s(self) -> float:
        return self.bound / self.total_s if self.total_s > 0 else 0.0


STALL_SECONDS = 5.0
"""No pod seen bound for this long: check with a LIST (kubectl's watch can stall or end under load)."""


class BindWatch:
    """`kubectl get pods --watch` in a namespace; the first moment each pod is seen with spec.nodeName.

    Under load kubectl's watch sometimes ends cleanly (rc 0) or stops printing in the middle of a burst. An
    ended watch is started again (its initial listing stamps the pods bound meanwhile); when no pod was seen
    bound for `STALL_SECONDS`, a LIST stamps the bound pods the watch missed with the LIST's end time (late,
    so the rate comes out low, never high) and the watch is restarted. Both are counted and reported."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        template = "jsonpath={.metadata.name} {.spec.nodeName}{'\\n'}"
        self.cmd = [
            str(cluster.binaries.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}",
            "get", "pods", "-n", namespace, "--watch", "-o", template,
        ]  # fmt: skip
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop)
        self.bound: dict[str, float] = {}
        self.restarts = 0
        self.late = 0
        self.stopping = threading.Event()
        self.changed = threading.Condition()
        self.proc = self._start()
        self.thread = threading.Thread(target=self._read, name="bind-watch", daemon=True)
        self.thread.start()

    def _start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.errors, text=True)

    def _read(self) -> None:
        while True:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                parts = line.split()
                if len(parts) == 2 and parts[0] not in self.bound:
                    with self.changed:
                        self.bound[parts[0]] = time.perf_counter()
                        self.changed.notify_all()
            self.proc.wait()
            if self.stopping.wait(0.5) or self.restarts >= 100:
                return
            self.restarts += 1
            self.proc = self._start()

    def _list_bound(self) -> list[str]:
        out = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{'\\n'}{end}",
            check=False, timeout=120,
        )  # fmt: skip
        return [p[0] for p in (line.split() for line in out.splitlines()) if len(p) == 2]

    def wait(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        seen, progress = -1, time.monotonic()
        while True:
            with self.changed:
                if len(self.bound) >= count:
                    return True
                if len(self.bound) != seen:
                    seen, progress = len(self.bound), time.monotonic()
                self.changed.wait(1.0)
            now = time.monotonic()
            if now >= deadline:
                return False
            if now - progress >= STALL_SECONDS:
                names = self._list_bound()
                listed = time.perf_counter()
                with self.changed:
                    for name in names:
                        if name not in self.bound:
                            self.bound[name] = listed
                            self.late += 1
                progress = time.monotonic()
                self.proc.terminate()  # the reader starts a fresh watch

    def stop(self) -> str:
        """Stop the watch; notes on restarts, LIST-stamped pods and kubectl stderr ("" if all went well)."""
        self.stopping.set()
        self.proc.terminate()
        self.thread.join(timeout=15)
        self.proc.wait(timeout=10)
        self.errors.seek(0)
        err = self.errors.read().strip()[-300:]
        self.errors.close()
        notes = []
        if self.restarts:
            notes.append(f"the kubectl watch was restarted {self.restarts}x")
        if self.late:
            notes.append(f"{self.late} pods were stamped by a LIST after the watch went quiet (late stamps)")
        if err:
            notes.append(f"kubectl: {err}")
        return "; ".join(notes)


def _insecure_get(url: str) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
        return str(resp.read().decode())


def histogram_summary(text: str, name: str, label: str) -> dict[str, str]:
    """Per value of `label` of histogram `name`: count, mean and p50/p99 as the bucket bound they fall in."""
    out: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        groups: dict[str, dict[str, Any]] = {}
        for sample in family.samples:
            key = sample.labels.get(label, "")
            group = groups.setdefault(key, {"buckets": [], "count": 0.0, "sum": 0.0})
            if sample.name.endswith("_bucket"):
                group["buckets"].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                group["count"] = sample.value
            elif sample.name.endswith("_sum"):
                group["sum"] = sample.value
        for key, group in sorted(groups.items()):
            count = group["count"]
            if not count:
                continue
            buckets = sorted(group["buckets"])

            def bound(q: float, buckets: list[tuple[float, float]] = buckets, count: float = count) -> str:
                for le, cumulative in buckets:
                    if cumulative >= q * count:
                        return "+Inf" if math.isinf(le) else f"{le * 1000:g}"
                return "?"

            out[key] = (
                f"n={count:.0f} mean {group['sum'] / count * 1000:.2f} ms, "
                f"p50 <= {bound(0.5)} ms, p99 <= {bound(0.99)} ms"
            )
    return out


def scheduler_metrics(cluster: Cluster) -> dict[str, str]:
    """kube-scheduler's attempt latency (result label) from its /metrics; {} when not readable."""
    try:
        text = _insecure_get(f"https://127.0.0.1:{cluster.component_port('kube-scheduler')}/metrics")
    except OSError as exc:
        return {"unreadable": repr(exc)}
    return histogram_summary(text, "scheduler_scheduling_attempt_duration_seconds", "result")


API_RESOURCES = ("pods", "events", "leases", "nodes")


def api_requests(cluster: Cluster) -> dict[str, tuple[float, float]]:
    """kube-apiserver's request count and total seconds by "VERB resource[/subresource]" for the resources
    a scheduling run writes or watches (from its /metrics); {} when not readable."""
    try:
        text = cluster.kubectl("get", "--raw", "/metrics", timeout=60)
    except (ClusterError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("resource") not in API_RESOURCES or labels.get("verb") in ("WATCH", "CONNECT"):
                continue
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            key = f"{labels['verb']} {labels['resource']}{sub}"
            count, total = out.get(key, (0.0, 0.0))
            if sample.name.endswith("_count"):
                out[key] = (count + sample.value, total)
            elif sample.name.endswith("_sum"):
                out[key] = (count, total + sample.value)
    return out


def binding_posts(cluster: Cluster) -> dict[str, float]:
    """kube-apiserver's pods/binding POSTs so far by HTTP code (`apiserver_request_total`)."""
    try:
        text = cluster.kubectl("get", "--raw", "/metrics", timeout=60)
    except (ClusterError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if (labels.get("resource"), labels.get("subresource"), labels.get("verb")) != (
                "pods",
                "binding",
                "POST",
            ) or not sample.name.endswith("_total"):
                continue
            out[labels.get("code", "")] = out.get(labels.get("code", ""), 0.0) + sample.value
    return out


SUMMARY_WAIT = 6.0
"""Seconds between counts of Events after the last bind: the extender writes its summaries every 5 s."""
SUMMARY_PATIENCE = 180.0
"""Seconds to keep counting until the Events cover every bound pod."""


def count_events(cluster: Cluster, namespace: str, since: str) -> tuple[int, int, int]:
    """The extender's GPUsAssigned Events for the run: per pod (in `namespace`), the pods counted in
    summary Events on Nodes (action BindSummary, written since `since`, an RFC 3339 time), and how many
    summary Events that was."""
    own = cluster.get_json("events.v1.events.k8s.io", "-n", namespace)["items"]
    per_pod = sum(
        1
        for e in own
        if e.get("reason") == "GPUsAssigned" and e.get("reportingController") == "gpuwarden.io/extender"
    )
    summarized = summaries = 0
    for e in cluster.get_json("events.v1.events.k8s.io", "-n", "default")["items"]:
        if e.get("action") != "BindSummary" or e.get("reason") != "GPUsAssigned":
            continue
        if str(e.get("eventTime") or "") < since:
            continue
        head = str(e.get("note", "")).split(" pods on node ", 1)[0]
        summarized += int(head.rsplit(" ", 1)[-1]) if head.rsplit(" ", 1)[-1].isdigit() else 0
        summaries += 1
    return per_pod, summarized, summaries


def api_delta(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> str:
    """The requests made between two `api_requests` snapshots: count and mean latency, busiest first."""
    rows = []
    for key, (count, total) in after.items():
        c0, t0 = before.get(key, (0.0, 0.0))
        if count - c0 >= 1:
            rows.append((count - c0, key, (total - t0) / (count - c0)))
    rows.sort(reverse=True)
    return (
        "; ".join(f"{key} {n:.0f} (mean {mean * 1000:.0f} ms)" for n, key, mean in rows[:8]) or "unreadable"
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pids: Mapping[str, int]) -> dict[tuple[str, int], float]:
    return {(name, pid): cpu_seconds(pid) for name, pid in pids.items()}


def cpu_per_pod(
    before: Mapping[tuple[str, int], float], after: Mapping[tuple[str, int], float], pods: int
) -> dict[str, float]:
    """CPU ms per bound pod by process name (a process started during the run counts from 0)."""
    by_name: dict[str, float] = {}
    for key in after:
        by_name[key[0]] = by_name.get(key[0], 0.0) + after[key] - before.get(key, 0.0)
    return {name: value * 1000 / max(1, pods) for name, value in by_name.items()}


def cpu_summary(
    before: Mapping[tuple[str, int], float], after: Mapping[tuple[str, int], float], pods: int, seconds: float
) -> str:
    """CPU ms per bound pod by process (a process started during the run counts from 0), and the share of
    all cores the processes used together over `seconds`."""
    used = {key: after[key] - before.get(key, 0.0) for key in after}
    by_name: dict[str, float] = {}
    for (name, _), value in used.items():
        by_name[name] = by_name.get(name, 0.0) + value
    total = sum(by_name.values())
    per_pod = 1000 / max(1, pods)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
    parts = [f"{name} {value * per_pod:.1f}" for name, value in ranked if value > 0]
    busy = total / seconds / (os.cpu_count() or 1) * 100 if seconds > 0 else 0.0
    return (
        f"CPU ms per pod: {'; '.join(parts)}; total {total * 1000 / max(1, pods):.1f} "
        f"({busy:.0f}% of {os.cpu_count()} cores over the run)"
    )


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class _Served:
    """A process serving extender verbs: `proc`, its log file; peak RSS while alive; stop = SIGTERM."""

    proc: subprocess.Popen[Any]
    _log: Any

    def peak_rss(self) -> int:
        return _peak_rss(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


class ExtenderProcess(_Served):
    """`tests.bench.extender_process` on a free loopback port; `metrics()` and `peak_rss()` while alive."""

    def __init__(self, cluster: Cluster, protocol: str, http_timeout: float = 5.0) -> None:
        self.port = ports.free_port("127.0.0.1")
        self.log = cluster.workdir / f"extender-{self.port}.log"
        self._log = self.log.open("w")
        section = json.loads(os.environ.get("GPUWARDEN_BENCH_EXTENDER_CONFIG", "{}"))
        section |= {"bind_protocol": protocol, "scheduler_http_timeout_seconds": http_timeout}
        env = {**os.environ, "GPUWARDEN_BENCH_EXTENDER_CONFIG": json.dumps(section)}
        if env.get("GPUWARDEN_BENCH_EXTENDER_PROFILE"):  # one profile per protocol (the backlog run's, last)
            env["GPUWARDEN_BENCH_EXTENDER_PROFILE"] += f".{protocol}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.extender_process",
             str(cluster.kubeconfig), str(self.port), PREFIX],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
        )  # fmt: skip

    def wait_ready(self, timeout: float) -> float:
        started = time.monotonic()
        assert self.proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(
            target=lambda: box.append(self.proc.stdout.readline() if self.proc.stdout else "")
        )
        reader.start()
        reader.join(timeout)
        if not box or box[0].strip() != "ready":
            raise RuntimeError(f"extender process not ready after {timeout:.0f} s (rc={self.proc.poll()})")
        return time.monotonic() - started

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def log_summary(self) -> str:
        """What the extender logged (warnings and errors: its log goes to stderr), by message."""
        self._log.flush()
        counts = Counter(line.strip()[:80] for line in self.log.read_text(errors="replace").splitlines())
        return "; ".join(f"{text!r} x{n}" for text, n in counts.most_common(4)) or "nothing"


NULL_SOURCE = Path(__file__).parent / "nullextender"


def build_null_extender() -> Path:
    """`tests/bench/nullextender` (Go, standard library only) built once into .cache/bench, keyed by its
    source; a few seconds the first time."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(NULL_SOURCE.glob("*.go")))).hexdigest()
    out = Path(__file__).resolve().parents[2] / ".cache" / "bench" / f"nullextender-{digest[:12]}"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        started = time.monotonic()
        subprocess.run(
            ["go", "build", "-trimpath", "-o", str(out), "."], cwd=NULL_SOURCE, env=env, check=True
        )
        print(f"  e2e null extender built in {time.monotonic() - started:.1f} s", flush=True)
    return out


class NullExtenderProcess(_Served):
    """The protocol's floor (tests/bench/nullextender): every node passes, scores 0, a plain Binding."""

    def __init__(self, cluster: Cluster) -> None:
        binary = build_null_extender()
        self.port = ports.free_port("127.0.0.1")
        doc = yaml.safe_load(cluster.kubeconfig.read_text())
        user = doc["users"][0]["user"]
        ctx = doc["clusters"][0]["cluster"]
        pki = Path(tempfile.mkdtemp(prefix="gw-null-", dir=cluster.workdir))
        files = {}
        for name, key in (
            ("ca", "certificate-authority"),
            ("cert", "client-certificate"),
            ("key", "client-key"),
        ):
            source = ctx if name == "ca" else user
            if f"{key}-data" in source:
                path = pki / f"{name}.pem"
                path.write_bytes(base64.b64decode(source[f"{key}-data"]))
                files[name] = str(path)
            else:
                files[name] = str(source[key])
        self.log = cluster.workdir / f"null-extender-{self.port}.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(
            [str(binary), f"--listen=127.0.0.1:{self.port}", f"--prefix={PREFIX}",
             f"--server={ctx['server']}", f"--ca={files['ca']}", f"--cert={files['cert']}",
             f"--key={files['key']}"],
            stdout=self._log, stderr=self._log,
        )  # fmt: skip

    def wait_ready(self, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"null extender not ready after {timeout:.0f} s (rc={self.proc.poll()})")


def create_pods(cluster: Cluster, namespace: str, pods: int, timeout: float) -> float:
    """`pods` GPU pods from `CREATORS` concurrent `kubectl create`; returns the seconds it took."""
    bodies = [pod_body(f"p{i:05d}", namespace, SIZES[i % len(SIZES)]) for i in range(pods)]
    chunks = [bodies[i::CREATORS] for i in range(CREATORS)]
    start = time.perf_counter()

    def create(chunk: list[dict[str, Any]]) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": chunk}
        cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(doc), timeout=timeout)

    with ThreadPoolExecutor(max_workers=CREATORS) as pool:
        list(pool.map(create, chunks))
    return time.perf_counter() - start


def scheduled_times(cluster: Cluster, namespace: str) -> dict[str, float]:
    """Pod name -> when kube-scheduler recorded it bound (epoch seconds): the `eventTime` (microseconds) of
    its `Scheduled` event, written right after the binding succeeded. Exact whatever the watch did."""
    out = cluster.kubectl(
        "get", "events.events.k8s.io", "-n", namespace, "-o", "json", check=False, timeout=120,
    )  # fmt: skip
    times: dict[str, float] = {}
    for item in json.loads(out or "{}").get("items", []):
        name, stamp = (item.get("regarding") or {}).get("name"), item.get("eventTime")
        if name and stamp and item.get("reason") == "Scheduled":
            moment = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
            times[name] = min(moment, times.get(name, moment))
    return times


def run_pods(
    cluster: Cluster,
    mode: str,
    namespace: str,
    pods: int,
    timeout: float,
    *,
    backlog_config: Mapping[str, Any] | None = None,
    extra_pids: Mapping[str, int] | None = None,
    kind: str = "",
) -> RunResult:
    """Time `pods` GPU pods in `namespace` until every one has a node. Stream (default): created while the
    scheduler runs, clock from the first create. Backlog (`backlog_config`): the scheduler is stopped, all
    pods are created, then it starts with that configuration; clock from its start."""
    ensure_namespace(cluster, namespace)
    api_before = api_requests(cluster)
    bindings_before = binding_posts(cluster)
    watch = BindWatch(cluster, namespace)
    time.sleep(2.0)  # the watch is established before the first pod exists

    def pids() -> dict[str, int]:
        return {**cluster.pids(), **(extra_pids or {})}

    try:
        if backlog_config is None:
            cpu_before = cpu_snapshot(pids())
            start = time.perf_counter()
            created = create_pods(cluster, namespace, pods, timeout)
        else:
            cluster.stop_scheduler()
            created = create_pods(cluster, namespace, pods, timeout)
            cpu_before = cpu_snapshot(pids())
            start = time.perf_counter()
            cluster.restart_scheduler(backlog_config)
        watch.wait(pods, timeout)
        cpu_after, cpu_end = cpu_snapshot(pids()), time.perf_counter()
        bound = dict(watch.bound)
    finally:
        trouble = watch.stop()
    # the watch says when all are bound; when each was, the scheduler's own events say exactly (a stalled
    # kubectl watch stamps late): epoch seconds mapped onto the perf_counter clock of `start`
    offset = time.time() - time.perf_counter()
    recorded = {
        name: at - offset for name, at in scheduled_times(cluster, namespace).items() if name in bound
    }
    if len(recorded) == len(bound):
        bound, source = recorded, "kube-scheduler's Scheduled events"
    else:
        source = f"the watch ({len(recorded)}/{len(bound)} Scheduled events found)"
    if trouble:
        print(f"  e2e {mode}: {trouble}; bind times from {source}", flush=True)
    first, last = (min(bound.values()), max(bound.values())) if bound else (start, start)
    kind = kind or ("stream" if backlog_config is None else "backlog")
    result = RunResult(mode, kind, pods, created, last - start, last - first, len(bound))
    result.api = api_delta(api_before, api_requests(cluster))
    after = binding_posts(cluster)
    result.bindings = {code: n - bindings_before.get(code, 0.0) for code, n in after.items()}
    result.bindings = {code: n for code, n in result.bindings.items() if n}
    result.cpu = cpu_summary(cpu_before, cpu_after, len(bound), cpu_end - start)
    result.cpu_ms = cpu_per_pod(cpu_before, cpu_after, len(bound))
    return result


def print_result(result: RunResult) -> None:
    rate = result.bound / result.total_s if result.total_s > 0 else 0.0
    spread = (result.bound - 1) / result.spread_s if result.spread_s > 0 else 0.0
    missing = "" if result.bound == result.pods else f"  ONLY {result.bound}/{result.pods} BOUND (timeout)"
    since = "the first create" if result.kind == "stream" else "the scheduler's start"
    print(
        f"  e2e {result.kind:<7} {result.mode:<24} {rate:7.1f} pods/s  ({result.bound} pods bound "
        f"{result.total_s:.1f} s after {since}; first to last bind {result.spread_s:.1f} s = {spread:.1f} "
        f"pods/s; creating the pods took {result.created_s:.1f} s){missing}",
        flush=True,
    )
    for verb, line in result.extender.items():
        print(f"      extender {verb:<11} {line}")
    for outcome, line in result.scheduler.items():
        print(f"      scheduler attempt {outcome:<13} {line}")
    print(f"      API requests: {result.api}")
    posts = ", ".join(f"{code} x{n:.0f}" for code, n in sorted(result.bindings.items())) or "none seen"
    print(f"      pods/binding POSTs by code: {posts}")
    if result.bind_requests:
        print(
            f"      binds per pod: {result.bind_requests / max(1, result.bound):.2f} bind requests, "
            f"{result.binds_started / max(1, result.bound):.2f} binds started (not joined, not shed)"
        )
    if result.events:
        print(f"      {result.events}")
    print(f"      {result.cpu}")


def delete_namespace(cluster: Cluster, namespace: str, timeout: float) -> float:
    started = time.monotonic()
    cluster.kubectl(
        "delete", "namespace", namespace, f"--timeout={int(timeout)}s", check=False, timeout=timeout + 30
    )
    return time.monotonic() - started


QUIET_CORES = 0.1
"""The control plane counts as settled once all its processes together use less than this many cores."""


def wait_quiet(cluster: Cluster, timeout: float = 300.0, window: float = 5.0) -> None:
    """Wait until the control plane has digested the fleet's creation. Right after 5,000 nodes turn Ready
    the API server, controller-manager and etcd stay busy for minutes (~0.45 cores measured); a run then
    would pay for it and the first mode measured would look slower than it is."""
    started = time.monotonic()
    while True:
        pids = cluster.pids()
        before = cpu_snapshot(pids)
        time.sleep(window)
        after = cpu_snapshot(pids)
        busy = {name: after[(name, pid)] - before.get((name, pid), 0.0) for name, pid in pids.items()}
        cores = sum(busy.values()) / window
        waited = time.monotonic() - started
        if cores < QUIET_CORES or waited >= timeout:
            state = "quiet" if cores < QUIET_CORES else f"still busy after {timeout:.0f} s"
            top = ", ".join(f"{name} {value / window:.2f}" for name, value in sorted(busy.items()))
            print(f"  e2e control plane {state} ({cores:.2f} cores: {top}) after {waited:.0f} s", flush=True)
            return


def e2e_throughput(nodes: int, pods: int, percentage: int | None) -> None:
    """The whole end-to-end part: build the fleet, run both modes, print numbers and peak RSS."""
    capacity_pods = int(nodes * 8 * 0.5 / (sum(SIZES) / len(SIZES)))
    if pods > capacity_pods:
        print(f"  e2e: {pods} pods would fill more than half of {nodes * 8} GPUs; using {capacity_pods}")
        pods = capacity_pods
    # kube-scheduler ignores --kube-api-qps once it has --config (kwokctl's disableQPSLimits only sets the
    # flag), so both runs would be capped by the config default of 50 requests/s (a binding and an Event per
    # pod: about 50 pods/s). scheduler_perf lifts the limit the same way; the same in both runs.
    extra: dict[str, Any] = {"clientConnection": {"qps": 5000, "burst": 10000}}
    if percentage is not None:
        extra["percentageOfNodesToScore"] = percentage
    to_find = max(100, nodes * (percentage or max(5, 50 - nodes // 125)) // 100)
    print(
        "  e2e scheduler config: percentageOfNodesToScore "
        + (f"{percentage}" if percentage is not None else "unset (adaptive: max(5, 50 - nodes/125) %)")
        + f" -> stops after {min(nodes, to_find)} feasible nodes of {nodes}; client qps 5000, burst 10000;"
        + " the same in both runs",
        flush=True,
    )
    config = quiet_fleet_config(
        ClusterConfig(
            name=f"gw-bench-{os.getpid()}",
            progress=False,
            ready_timeout=300,
            scheduler_config=scheduler_configuration(SchedulerSettings(extra=extra)),
        )
    )
    print(
        f"  e2e kwok: {json.dumps(dict(config.kwok_options))}; "
        f"kwokctl: {json.dumps(dict(config.kwokctl_options))}",
        flush=True,
    )
    started = time.monotonic()
    cluster = Cluster.create(config)
    timeout = max(300.0, pods * 0.6)
    try:
        print(f"  e2e cluster up in {time.monotonic() - started:.0f} s", flush=True)
        specs = [GpuNodeSpec(name=f"bench-{i:05d}", gpus=8, topology=topology(2, 4)) for i in range(nodes)]
        took = create_fleet(cluster, specs)
        print(f"  e2e {nodes} kwok GPU nodes (8 GPUs, 2 NUMA x 4) Ready in {took:.0f} s", flush=True)
        wait_quiet(cluster)
        default = scheduler_configuration(SchedulerSettings(extra=extra))
        results = [
            measure(cluster, "default scheduler", pods, timeout, None),
            measure(cluster, "default scheduler", pods, timeout, default),
        ]
        for backlog in (False, True):
            results += extender_round(cluster, pods, timeout, extra, backlog=backlog)
        if OVERLOAD not in ("", "0"):
            results += extender_round(cluster, pods, timeout, extra, backlog=True, http_timeout=OVERLOAD)
        print_peak_rss(results)
        print_three_way(results)
        summarize(results, nodes)
    finally:
        cluster.delete()


def extender_round(
    cluster: Cluster,
    pods: int,
    timeout: float,
    extra: dict[str, Any],
    *,
    backlog: bool,
    http_timeout: str = "5s",
) -> list[RunResult]:
    """The null extender, then gpuwarden's in each protocol, in one kind; with an `http_timeout` other than
    the default 5 s, the overload kind (a backlog, the scheduler's patience cut to it)."""
    kind = "overload" if http_timeout != "5s" else ""
    seconds = float(http_timeout.removesuffix("s"))
    results: list[RunResult] = []
    null = NullExtenderProcess(cluster)
    try:
        null.wait_ready(60)
        spec = ExtenderSpec(
            url_prefix=f"http://127.0.0.1:{null.port}{PREFIX}", prioritize_verb="prioritize",
            preempt_verb="preempt", bind_verb="bind" if BIND else "", weight=12,
            node_cache_capable=True, managed_resources=["nvidia.com/gpu"], http_timeout=http_timeout,
        )  # fmt: skip
        with_null = scheduler_configuration(SchedulerSettings(extenders=[spec], extra=extra))
        if not backlog:
            cluster.restart_scheduler(with_null)
        results.append(
            measure(
                cluster, "null extender", pods, timeout, with_null if backlog else None, null=null, kind=kind
            )
        )
    finally:
        null.stop()
    for protocol in PROTOCOLS:
        extender = ExtenderProcess(cluster, protocol, seconds)
        try:
            synced = extender.wait_ready(600)
            print(
                f"  e2e extender process ({protocol} bind protocol, httpTimeout {http_timeout}) synced its "
                f"model and warmed its answers in {synced:.1f} s",
                flush=True,
            )
            spec = ExtenderSpec(
                url_prefix=f"http://127.0.0.1:{extender.port}{PREFIX}", prioritize_verb="prioritize",
                preempt_verb="preempt", bind_verb="bind" if BIND else "", weight=12,
                node_cache_capable=True, managed_resources=["nvidia.com/gpu"], http_timeout=http_timeout,
            )  # fmt: skip
            with_extender = scheduler_configuration(SchedulerSettings(extenders=[spec], extra=extra))
            if not backlog:
                cluster.restart_scheduler(with_extender)
            results.append(
                measure(
                    cluster,
                    mode_name(protocol),
                    pods,
                    timeout,
                    with_extender if backlog else None,
                    extender,
                    kind=kind,
                )
            )
        finally:
            extender.stop()
    return results


def mode_name(protocol: str) -> str:
    """The run's mode: its first word keys the tables (`with`: the leader protocol, `claim`: the other)."""
    if not BIND:
        return "with gpuwarden extender, no bind verb"
    return "with gpuwarden extender" if protocol == "leader" else "claim-protocol gpuwarden extender"


def measure(
    cluster: Cluster,
    mode: str,
    pods: int,
    timeout: float,
    backlog_config: Mapping[str, Any] | None,
    extender: ExtenderProcess | None = None,
    *,
    null: NullExtenderProcess | None = None,
    kind: str = "",
) -> RunResult:
    """One timed run, its latency breakdown and peak RSS printed; its pods deleted afterwards."""
    tag = kind or ("backlog" if backlog_config else "stream")
    namespace = f"bench-{mode.split()[0]}-{tag}"
    extra = {"gpuwarden extender": extender.proc.pid} if extender is not None else None
    if null is not None:
        extra = {"null extender": null.proc.pid}
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    result = run_pods(
        cluster, mode, namespace, pods, timeout, backlog_config=backlog_config, extra_pids=extra, kind=kind
    )
    result.scheduler = scheduler_metrics(cluster)
    result.peak_rss = cluster.control_plane_peak_rss()
    if extender is not None:
        text = extender.metrics()
        result.extender = histogram_summary(text, "gpuwarden_extender_request_duration_seconds", "verb")
        phases = histogram_summary(text, "gpuwarden_extender_bind_phase_seconds", "phase")
        result.extender.update({f"  {phase}": line for phase, line in phases.items()})
        result.extender.update(extender_counters(text))
        result.bind_requests, result.binds_started = bind_counts(text)
        waited = time.monotonic()
        while True:  # summaries go out in rounds of 32 every 5 s: count until they cover every pod
            time.sleep(SUMMARY_WAIT)
            per_pod, summarized, summaries = count_events(cluster, namespace, since)
            if per_pod + summarized >= result.bound or time.monotonic() - waited > SUMMARY_PATIENCE:
                break
        result.events = (
            f"GPUsAssigned Events: {per_pod} per pod + {summarized} pods in {summaries} node summaries = "
            f"{per_pod + summarized} for {result.bound} pods bound ({per_pod + summaries} Events written; "
            f"counted {time.monotonic() - waited:.0f} s after the last bind)"
        )
        result.peak_rss["gpuwarden extender"] = extender.peak_rss()
        result.extender["log"] = extender.log_summary()
    if null is not None:
        result.peak_rss["null extender"] = null.peak_rss()
    print_result(result)
    took = delete_namespace(cluster, namespace, 300)
    print(f"      (its pods deleted in {took:.0f} s)", flush=True)
    return result


def extender_counters(text: str) -> dict[str, str]:
    """Bind outcomes, conflicts and dropped bind Events from the extender's counters, as one line."""
    parts = []
    counted = (
        "gpuwarden_extender_requests",
        "gpuwarden_extender_bind_conflicts",
        "gpuwarden_extender_events_dropped",
        "gpuwarden_extender_events_summarized",
        "gpuwarden_extender_bind_overload",
    )
    for family in text_string_to_metric_families(text):
        if family.name in counted:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    parts.append(
                        f"{family.name.removeprefix('gpuwarden_extender_')}{{{labels}}} {sample.value:.0f}"
                    )
    return {"counters": "; ".join(parts)} if parts else {}


def bind_counts(text: str) -> tuple[float, float]:
    """(bind requests, binds started) from the extender's counters: requests of verb bind, less the ones
    that joined a running bind or were shed."""
    requests = cut = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpuwarden_extender_requests_total" and sample.labels.get("verb") == "bind":
                requests += sample.value
            elif sample.name == "gpuwarden_extender_bind_overload_total" and sample.labels.get("action") in (
                "joined",
                "shed",
            ):
                cut += sample.value
    return requests, requests - cut


def print_peak_rss(results: list[RunResult]) -> None:
    merged: dict[str, int] = {}
    for result in results:
        for name, value in result.peak_rss.items():
            key = f"kube-scheduler ({result.mode}, {result.kind})" if name == "kube-scheduler" else name
            merged[key] = max(merged.get(key, 0), value)
    print("  e2e peak RSS (VmHWM): " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in merged.items()))


def three_way(results: list[RunResult]) -> list[str]:
    """The table issue 20 asks for: per kind, pods/s of the default scheduler, the null extender and
    gpuwarden's, the extender process's own CPU ms per pod, the whole machine's, and gpuwarden / null."""
    lines = [
        f"  {'kind':<8} {'default':>9} {'null ext.':>10} {'gpuwarden':>10} {'gw/null':>8}   "
        f"{'ext. CPU ms/pod (null, gw)':>27}   {'total CPU ms/pod (default, null, gw)':>37}"
    ]
    for kind in ("stream", "backlog", "overload"):
        by_mode: dict[str, RunResult] = {}
        for r in results:
            if r.kind == kind:
                by_mode[r.mode.split()[0]] = r  # the last default run of the kind (the warm one)
        d, n = by_mode.get("default"), by_mode.get("null")
        for key, label in (("with", kind), ("claim-protocol", "  (claim)")):
            g = by_mode.get(key)
            if n is None or g is None:
                continue
            ratio = g.pods_per_s / n.pods_per_s if n.pods_per_s > 0 else 0.0
            ext = f"{n.cpu_ms.get('null extender', 0.0):.1f}, {g.cpu_ms.get('gpuwarden extender', 0.0):.1f}"
            totals = ", ".join(f"{sum(r.cpu_ms.values()):.1f}" if r else "-" for r in (d, n, g))
            lines.append(
                f"  {label:<8} {d.pods_per_s if d else 0.0:9.1f} {n.pods_per_s:10.1f} {g.pods_per_s:10.1f} "
                f"{ratio * 100:7.0f}%   {ext:>27}   {totals:>37}"
            )
            extra = {
                name.replace("gpuwarden extender", "extender"): g.cpu_ms.get(name, 0.0)
                - n.cpu_ms.get(name.replace("gpuwarden extender", "null extender"), 0.0)
                for name in g.cpu_ms
            }
            where = ", ".join(
                f"{name} {value:+.1f}" for name, value in sorted(extra.items(), key=lambda kv: -kv[1])
            )
            lines.append(f"           CPU ms/pod gpuwarden - null, by process: {where}")
            created = g.bindings.get("201", 0.0)
            lines.append(
                f"           binds per pod: {g.bind_requests / max(1, g.bound):.2f} requests, "
                f"{g.binds_started / max(1, g.bound):.2f} started; Binding POSTs 201 x{created:.0f} for "
                f"{g.bound} pods (409 x{g.bindings.get('409', 0.0):.0f}); {g.events or 'Events not counted'}"
            )
    return lines


def print_three_way(results: list[RunResult]) -> None:
    print("  e2e three-way (pods/s; goal: gpuwarden >= 90 % of the null extender, extender CPU <= 3 ms/pod):")
    for line in three_way(results):
        print(line, flush=True)


API_EXTRA_TODAY = {"stream": 5.7, "backlog": 4.5}
"""kube-apiserver CPU ms per pod with gpuwarden over the null extender when issue 29 was filed (2026-12-02,
docs/extender.md): its goal is at most half of that."""


def summarize(results: list[RunResult], nodes: int) -> None:
    """The run summary's rows, per kind: the three-way table's numbers against the null extender (the
    protocol's floor) and the default scheduler, with the goals of issues 6 and 29."""
    for kind in ("stream", "backlog"):
        by_mode = {r.mode.split()[0]: r for r in results if r.kind == kind}  # the last run of each mode
        d, n, g = by_mode.get("default"), by_mode.get("null"), by_mode.get("with")
        if g is None:
            continue
        where = f"e2e {kind}, {nodes:,} kwok nodes"
        if n is not None:
            null = "null extender (Go, protocol floor)"
            ratio = g.pods_per_s / n.pods_per_s if n.pods_per_s > 0 else 0.0
            record(
                "extender",
                f"{where}: pods/s",
                g.pods_per_s,
                "pods/s",
                anchor=null,
                anchor_value=n.pods_per_s,
                goal="≥ 90 % of the null extender (issue 20)",
                met=ratio >= 0.9,
            )
            ours_cpu = g.cpu_ms.get("gpuwarden extender", 0.0)
            record(
                "extender",
                f"{where}: extender's own CPU per pod",
                ours_cpu,
                "ms",
                anchor=null,
                anchor_value=n.cpu_ms.get("null extender", 0.0),
                goal="≤ 2 ms (issue 29)",
                met=ours_cpu <= 2,
            )
            api, api_null = g.cpu_ms.get("kube-apiserver", 0.0), n.cpu_ms.get("kube-apiserver", 0.0)
            limit = API_EXTRA_TODAY[kind] / 2
            record(
                "extender",
                f"{where}: kube-apiserver CPU per pod",
                api,
                "ms",
                anchor=f"with the {null}",
                anchor_value=api_null,
                goal=f"≤ anchor + {limit:.2f} ms (half today's extra, issue 29)",
                met=api - api_null <= limit,
            )
        c = by_mode.get("claim-protocol")
        if n is not None and c is not None:  # the claim bind protocol, reported beside the leader one
            claim = f"{where}, claim bind protocol"
            ext, api_c = c.cpu_ms.get("gpuwarden extender", 0.0), c.cpu_ms.get("kube-apiserver", 0.0)
            record(
                "extender", f"{claim}: pods/s", c.pods_per_s, "pods/s", anchor=null, anchor_value=n.pods_per_s
            )
            record("extender", f"{claim}: extender's own CPU per pod", ext, "ms", anchor=null,
                   anchor_value=n.cpu_ms.get("null extender", 0.0))  # fmt: skip
            record("extender", f"{claim}: kube-apiserver CPU per pod", api_c, "ms", anchor=f"with the {null}",
                   anchor_value=n.cpu_ms.get("kube-apiserver", 0.0))  # fmt: skip
        if d is not None:
            record(
                "extender",
                f"{where}: pods/s",
                g.pods_per_s,
                "pods/s",
                anchor="default scheduler",
                anchor_value=d.pods_per_s,
                goal="≥ 100 pods/s (issue 6)",
                met=g.pods_per_s >= 100,
            )


def settings_from_env(environ: Mapping[str, str]) -> tuple[int, int, int | None]:
    """(nodes, pods, percentageOfNodesToScore) from GPUWARDEN_BENCH_E2E_NODES / _PODS / _PERCENTAGE."""
    nodes = int(environ.get("GPUWARDEN_BENCH_E2E_NODES", "5000"))
    pods = int(environ.get("GPUWARDEN_BENCH_E2E_PODS", "1000"))
    raw = environ.get("GPUWARDEN_BENCH_E2E_PERCENTAGE", "")
    return nodes, pods, int(raw) if raw else None
