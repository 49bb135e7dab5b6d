"""Load curves, workloads and first-fit placement of pods on GPUs — the demand side of the simulator.

Why it exists: GPU utilization in the simulator is not random noise; it follows the QPS each workload must
serve, split over the pods that currently serve it. So an HPA scaling a Deployment out (and the demo mapping
the new pods to GPUs) lowers per-GPU utilization, exactly the loop the adapter must close.
Everything here is pure: times are passed in, nothing reads a clock or does I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.simulator.engine import Engines

if TYPE_CHECKING:
    from harness.simulator.scenario import Scenario


@dataclass(frozen=True)
class LoadCurve:
    """Piecewise-linear QPS over time since `origin`; flat before the first and after the last point.

    With `loop`, time wraps modulo `loop` seconds (the segment from the last point back to the first is flat).
    """

    points: tuple[tuple[float, float], ...]
    origin: float = 0.0
    loop: float | None = None

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a load curve needs at least one point")

    @classmethod
    def constant(cls, qps: float, origin: float = 0.0) -> LoadCurve:
        return cls(((0.0, qps),), origin)

    def qps(self, now: float) -> float:
        t = now - self.origin
        if self.loop:
            t %= self.loop
        i = bisect.bisect_right(self.points, t, key=lambda p: p[0])
        if i == 0:
            return self.points[0][1]
        if i == len(self.points):
            return self.points[-1][1]
        (t0, q0), (t1, q1) = self.points[i - 1], self.points[i]
        return q0 + (q1 - q0) * (t - t0) / (t1 - t0)


@dataclass(eq=False)
class WorkloadState:
    """A workload at run time: its curve, capacity per GPU and the pods currently serving it.

    `gateway_requests` integrates the whole curve, pods or not: the requests a gateway in front of the
    workload received (`gateway_requests_total`), the one signal that exists while no pod runs and so the
    one an HPA with `minReplicas: 0` can scale on. `gateway` is False for workloads nobody set a load for
    (bare pods mapped for a training job): no gateway stands in front of those.
    """

    namespace: str
    name: str
    curve: LoadCurve
    qps_per_gpu: float = 100.0
    memory_mib_per_gpu: int = 16384
    container: str = ""
    pods: dict[str, Pod] = field(default_factory=dict)
    gateway: bool = True
    gateway_requests: float = 0.0
    engines: Engines | None = None
    """A serving engine per pod (vLLM- or TGI-shaped series) and the router queue in front; None: none."""

    def pod_qps(self, now: float) -> float:
        """QPS each pod serves at `now` (load split evenly over the pods mapped to GPUs)."""
        return self.curve.qps(now) / len(self.pods) if self.pods else 0.0


POD_IDLE_CORES = 0.05
"""Host CPU of a serving pod with idle GPUs (its process and runtime)."""
CORES_PER_BUSY_GPU = 1.0
"""Host CPU a fully busy GPU costs its pod (feeding it: tokenizing, batching, copies)."""
POD_BASE_MEMORY = 2**30
HOST_MEMORY_PER_GPU = 2 * 2**30
"""Host working set: 1 GiB for the process plus 2 GiB per GPU (pinned staging buffers)."""


@dataclass(eq=False)
class Pod:
    """A pod holding GPUs of one node; `requests` integrates its QPS (http_requests_total), `cpu_seconds` its
    host CPU (the cAdvisor counter)."""

    namespace: str
    name: str
    container: str
    workload: WorkloadState
    node: str
    gpus: tuple[int, ...]
    requests: float = 0.0
    cpu_seconds: float = 0.0
    slots: tuple[int, ...] = ()
    """On a shared node, per entry of `gpus`: the replica (time-slicing) or MIG instance position held."""

    def demand(self, now: float) -> float:
        """Percent of one whole GPU each of the pod's devices would be busy (unclamped)."""
        per_gpu = self.workload.pod_qps(now) / len(self.gpus)
        return 100.0 * per_gpu / self.workload.qps_per_gpu

    def gpu_util(self, now: float) -> float:
        """Utilization (%) of each GPU the pod holds: its share of the QPS over its GPUs' capacity."""
        return min(100.0, self.demand(now))

    def cpu_cores(self, now: float) -> float:
        """Host cores in use: idle cost plus a core per fully busy GPU."""
        return POD_IDLE_CORES + CORES_PER_BUSY_GPU * len(self.gpus) * self.gpu_util(now) / 100.0

    @property
    def memory_bytes(self) -> int:
        """Host memory working set (constant: the model lives in GPU memory)."""
        return POD_BASE_MEMORY + HOST_MEMORY_PER_GPU * len(self.gpus)


class PlacementError(ValueError):
    """The scenario's replicas do not fit the fleet."""

    def __init__(self, message: str, workload_index: int) -> None:
        super().__init__(message)
        self.workload_index = workload_index


@dataclass(frozen=True)
class Placement:
    workload_index: int
    pod: str
    node_index: int
    gpus: tuple[int, ...]


def numa_of(gpu: int, gpus_per_node: int, numa_nodes: int) -> int:
    """NUMA node of GPU `gpu`: GPUs are split evenly and in order (8 GPUs, 2 NUMA: 0-3 -> 0, 4-7 -> 1)."""
    return gpu * numa_nodes // gpus_per_node


def choose_gpus(
    free: Sequence[int], want: int, gpus_per_node: int, numa_nodes: int
) -> tuple[int, ...] | None:
    """Lowest free GPUs of one NUMA node if possible, else the lowest free GPUs of the node, else None."""
    if len(free) < want:
        return None
    by_numa: dict[int, list[int]] = {}
    for g in free:
        by_numa.setdefault(numa_of(g, gpus_per_node, numa_nodes), []).append(g)
    for numa in sorted(by_numa):
        if len(by_numa[numa]) >= want:
            return tuple(by_numa[numa][:want])
    return tuple(sorted(free)[:want])


def place_replicas(scenario: Scenario) -> list[Placement]:
    """First-fit placement of every workload's replicas, in scenario order; raises PlacementError."""
    fleet = scenario.fleet
    free: list[list[int]] = [list(range(fleet.gpus_per_node)) for _ in range(fleet.nodes)]
    placements: list[Placement] = []
    for wi, w in enumerate(scenario.workloads):
        start = 0  # nodes before `start` cannot fit this workload's pod size any more
        for r in range(w.replicas):
            while start < fleet.nodes and len(free[start]) < w.gpus_per_pod:
                start += 1
            chosen: tuple[int, ...] | None = None
            for ni in range(start, fleet.nodes):
                chosen = choose_gpus(free[ni], w.gpus_per_pod, fleet.gpus_per_node, fleet.numa_nodes)
                if chosen is not None:
                    break
            if chosen is None:
                raise PlacementError(
                    f"replica {r} of {w.namespace}/{w.name} does not fit: "
                    f"no node has {w.gpus_per_pod} free GPUs left",
                    wi,
                )
            free[ni] = [g for g in free[ni] if g not in chosen]
            placements.append(Placement(wi, f"{w.name}-{r}", ni, chosen))
    return placements
