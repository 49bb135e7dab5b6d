"""Large kwok fleets (thousands of fake GPU nodes) for benchmarks, and the cluster settings they need.

`add_gpu_nodes` creates one list in one ``kubectl create`` and re-reads every node on each poll: right for
the e2e tier's handful of nodes, too slow and too heavy at 5,000. Here nodes are created in batches by a
bounded number of concurrent ``kubectl create`` processes, readiness is counted from a compact listing, and
progress is printed as it goes.

A fleet of 5,000 kwok nodes on a 2-core machine also needs kwok and kube-controller-manager told to be
quiet: every node renews a Lease every quarter of its lease duration and kwok refreshes node status by a
stage with its own delay. `quiet_fleet_config` stretches both (and the node-monitor grace period that must
exceed the lease duration, or the node lifecycle controller would taint every node unreachable).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from harness.testbed.cluster import Cluster, ClusterConfig
from harness.testbed.nodes import GPU_RESOURCE, TESTBED_LABEL, GpuNodeSpec
from harness.testbed.waiting import poll

READY_LISTING = (
    "jsonpath={range .items[*]}{.metadata.name}{' '}"
    "{.status.conditions[?(@.type=='Ready')].status}{' '}"
    "{.status.allocatable.nvidia\\.com/gpu}{'\\n'}{end}"
)


def quiet_fleet_config(
    config: ClusterConfig,
    *,
    lease_seconds: int = 3600,
    node_parallelism: int = 8,
    pod_parallelism: int = 16,
) -> ClusterConfig:
    """`config` with kwok's node leases stretched to `lease_seconds` (renewed every quarter of that) and
    kube-controller-manager's node-monitor grace period above it; kwok's stage parallelism raised so node
    initialisation and pod transitions keep up with a fleet created in bulk.

    The default (renewals every 15 minutes) keeps the renewal wave of a fleet created in one go out of a
    benchmark's measured minutes: with 1,200 s, 5,000 renewals (~40 writes/s) landed in the middle of one."""
    kwokctl = {
        # kwokctl multiplies its heartbeat durations by this factor (its flag's default is 5): 1 = as written.
        "heartbeatFactor": 1,
        "nodeLeaseDurationSeconds": lease_seconds,
        "kubeControllerManagerNodeMonitorGracePeriodMilliseconds": (lease_seconds + 60) * 1000,
        "kubeControllerManagerNodeMonitorPeriodMilliseconds": 60_000,
        **config.kwokctl_options,
    }
    kwok = {
        "nodeLeaseDurationSeconds": lease_seconds,
        "nodeLeaseParallelism": 4,
        "nodePlayStageParallelism": node_parallelism,
        "podPlayStageParallelism": pod_parallelism,
        **config.kwok_options,
    }
    return replace(config, kwokctl_options=kwokctl, kwok_options=kwok)


def _say(message: str) -> None:
    print(f"  [fleet] {message}", file=sys.stderr, flush=True)


def ready_nodes(cluster: Cluster, want_gpus: dict[str, str]) -> int:
    """How many of `want_gpus`' nodes are Ready with the wanted GPU allocatable (one compact listing)."""
    out = cluster.kubectl(
        "get", "nodes", "-l", TESTBED_LABEL, "--chunk-size=1000", "-o", READY_LISTING, timeout=120
    )
    count = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) in (2, 3) and parts[1] == "True" and want_gpus.get(parts[0]) == "".join(parts[2:]):
            count += 1
    return count


def create_fleet(
    cluster: Cluster,
    specs: Sequence[GpuNodeSpec],
    *,
    batch: int = 250,
    concurrency: int = 2,
    timeout: float = 1800.0,
    say: Callable[[str], None] = _say,
) -> float:
    """Create the nodes (`concurrency` kubectl processes, `batch` nodes each), wait until all are Ready with
    their GPUs; returns the seconds it took. Progress goes through `say`."""
    started = time.monotonic()
    batches = [list(specs[i : i + batch]) for i in range(0, len(specs), batch)]
    created = 0

    def create(group: list[GpuNodeSpec]) -> int:
        doc: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": [s.manifest() for s in group]}
        cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(doc), timeout=600)
        return len(group)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for done in pool.map(create, batches):
            created += done
            say(f"created {created}/{len(specs)} nodes ({time.monotonic() - started:.0f} s)")
    want = {s.name: str(s.gpu_slots() if s.gpu_slots() is not None else "") for s in specs}
    last = [-1]

    def all_ready() -> bool:
        count = ready_nodes(cluster, want)
        if count != last[0]:
            say(f"{count}/{len(specs)} nodes Ready with {GPU_RESOURCE} ({time.monotonic() - started:.0f} s)")
            last[0] = count
        return count == len(specs)

    poll(all_ready, timeout=timeout, interval=5.0, what=f"{len(specs)} kwok nodes Ready")
    return time.monotonic() - started
