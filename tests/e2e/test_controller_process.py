"""`gpuwarden controller` and `gpuwarden plan` as real processes against the real control plane.

The capability tests drive each loop in-process; this one checks the deployable itself: flags and config
load, one process wires leader election, the scheduled passes, the extender webhook, probes and /metrics,
and SIGTERM releases the Lease so a standby can take over at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness.testbed import Cluster, ensure_namespace
from tests.e2e.conftest import GPU_NODES, free_port, pod_manifest

pytestmark = pytest.mark.e2e

NS = "gpuwarden-controller-e2e"
LEASE = "gpuwarden-controller-e2e"


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (httpx.HTTPError, subprocess.CalledProcessError) as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@pytest.fixture
def controller_config(cluster: Cluster, tmp_path: Path) -> tuple[Path, int]:
    ensure_namespace(cluster, NS)
    port = free_port()
    doc = {
        # Prometheus is deliberately unreachable: the quarantine loop must treat that as unknown.
        "prometheus": {"url": f"http://127.0.0.1:{free_port()}", "timeout_seconds": 1, "retries": 0},
        "kubernetes": {
            "kubeconfig": str(cluster.kubeconfig),
            "namespace": NS,
            "leader_election": {
                "lease_name": LEASE,
                "lease_duration_seconds": 4,
                "renew_deadline_seconds": 3,
                "retry_period_seconds": 0.5,
            },
        },
        "health": {"loop_interval_seconds": 1},
        "nominations": {"loop_interval_seconds": 1},
        "extender": {"bind_address": "127.0.0.1", "port": port},
        "logging": {"format": "json"},
    }
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, port


def _gpuwarden(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwarden", *args]


@pytest.fixture
def controller_process(
    controller_config: tuple[Path, int], tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    path, _ = controller_config
    log = (tmp_path / "controller.log").open("wb")
    proc = subprocess.Popen(_gpuwarden("controller", "--config", str(path)), stdout=log, stderr=log)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def _gauge(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return max(values, default=0.0)


def _sample(text: str, series: str) -> float:
    """The value of one exposition line, by its exact name and labels (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _apiserver_watches(cluster: Cluster) -> dict[str, float]:
    """Watch streams open on the API server now, per core resource (its `apiserver_longrunning_requests`):
    every client's, so a difference taken around one client's life is that client's."""
    out: dict[str, float] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").splitlines():
        core_watch = 'verb="WATCH"' in line and 'group=""' in line
        if line.startswith("apiserver_longrunning_requests{") and core_watch:
            resource = line.split('resource="', 1)[1].split('"', 1)[0]
            out[resource] = out.get(resource, 0.0) + float(line.split()[-1])
    return out


def _lease_holder(cluster: Cluster) -> str:
    lease = cluster.get_json("-n", NS, "lease", LEASE)
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def test_controller_serves_leads_filters_and_releases_on_sigterm(
    cluster: Cluster,
    controller_config: tuple[Path, int],
    controller_process: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    _, port = controller_config
    base = f"http://127.0.0.1:{port}"
    _wait(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 60, "/readyz 200")
    holder = _wait(lambda: _lease_holder(cluster), 30, "the Lease to be held")

    metrics = httpx.get(f"{base}/metrics", timeout=5).text
    assert 'gpuwarden_build_info{component="controller"' in metrics
    assert f'gpuwarden_leader{{lease="{NS}/{LEASE}"}} 1.0' in metrics

    # The extender answers the scheduler's wire format on the configured prefix.
    pod = pod_manifest("probe", gpus=2)
    pod["metadata"].update({"namespace": NS, "uid": "00000000-0000-0000-0000-000000000001"})
    args = {"Pod": pod, "Nodes": None, "NodeNames": list(GPU_NODES)}
    answer = httpx.post(f"{base}/gpuwarden/filter", json=args, timeout=5)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["Error"] in ("", None)
    assert sorted(body["NodeNames"]) == sorted(GPU_NODES), body
    bad = httpx.post(f"{base}/gpuwarden/filter", content=b"{not json", timeout=5)
    assert bad.status_code == 400

    # Prometheus is down: the scheduled quarantine passes still run, and taint nothing (unknown data).
    last_pass = "gpuwarden_health_last_pass_timestamp_seconds"
    _wait(
        lambda: _gauge(httpx.get(f"{base}/metrics", timeout=5).text, last_pass) > 0, 30, "a quarantine pass"
    )
    # A quarantine pass ran (its node cache listed) and the extender is ready (the model listed): one node
    # and one live-pod list+watch stream serve every capability - the GPU model (extender, make-room,
    # nominations), quarantine, drain, idle GPUs and the preemption observer. (Other pod LISTs happen per
    # pass - the failed pods the admission-failure signal reads - but no other stream is opened.)
    metrics = httpx.get(f"{base}/metrics", timeout=5).text
    listed = 'gpuwarden_kube_requests_total{outcome="success",resource="nodes",verb="list"}'
    assert _sample(metrics, listed) == 1.0, [line for line in metrics.splitlines() if "list" in line]
    for kind in ("nodes", "pods"):
        watched = f'gpuwarden_kube_requests_total{{outcome="success",resource="{kind}",verb="watch"}}'
        assert _sample(metrics, watched) == 1.0, [line for line in metrics.splitlines() if "watch" in line]

    for node in GPU_NODES:
        taints = cluster.get_json("node", node).get("spec", {}).get("taints") or []
        assert not [t for t in taints if t["key"].startswith("gpuwarden.io/")], (node, taints)

    running = _apiserver_watches(cluster)
    controller_process.send_signal(signal.SIGTERM)
    assert controller_process.wait(30) == 0
    # The API server's own count agrees: the streams that close with the controller are one per kind.
    closed: dict[str, float] = {}
    for _ in range(50):
        after = _apiserver_watches(cluster)
        closed = {kind: running.get(kind, 0.0) - after.get(kind, 0.0) for kind in ("nodes", "pods")}
        if closed == {"nodes": 1.0, "pods": 1.0}:
            break
        time.sleep(0.2)
    assert closed == {"nodes": 1.0, "pods": 1.0}, (running, closed)
    assert _lease_holder(cluster) == "", f"SIGTERM must release the Lease held by {holder}"


def test_plan_prints_every_loop_as_json(cluster: Cluster, controller_config: tuple[Path, int]) -> None:
    path, _ = controller_config
    proc = subprocess.run(
        _gpuwarden("plan", "--config", str(path), "-o", "json"),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert set(doc) == {
        "gpus",
        "nvlink_domains",
        "quarantine",
        "nominations",
        "drain",
        "gpu_preemption",
        "idle",
        "modes",
    }
    domain_keys = {"domain", "trays", "gpus", "quarantined_trays", "members"}
    assert all(domain_keys <= set(d) for d in doc["nvlink_domains"])
    assert set(doc["modes"].values()) <= {"off", "observe", "act"} and "health" in doc["modes"]
    assert all({"node", "mode", "physical_gpus"} <= set(g) for g in doc["gpus"])
    assert set(doc["drain"]) == {"gate_closed", "nodes"}
    assert set(doc["gpu_preemption"]) == {"preemptions", "skipped", "tenants"}
    assert doc["nominations"]["clear"] == []
