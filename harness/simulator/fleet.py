"""The simulated fleet as plain state: nodes, GPUs, health counters, pods on GPUs; time is injected.

Why it exists: health rules, the quarantine controller, the adapter and the demo all need a GPU fleet whose
behaviour is known exactly — sticky XIDs, monotonic ECC counters, faults at given times, utilization that
follows load. This module is that fleet and nothing else: no I/O, no clock reads (time only enters through
`advance(now)`), no text rendering (`exposition.py`), no HTTP (`server.py`, `control.py`).

Time moves in steps of `exporter.tick` seconds: `advance(now)` integrates counters up to the last whole step,
applies scheduled faults that became due (each stamped with its own time) and expires timed conditions.
Run-time changes (faults, load, pods) apply at once and bump `version`, so a cached exposition is never served
after a change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuwarden.errors import ConfigError
from harness.simulator.hardware import Gpu, Node, build_nodes, set_readings
from harness.simulator.scenario import (
    SIGNAL_KINDS,
    ExporterDownFault,
    Fault,
    GpuModel,
    NvswitchFault,
    Scenario,
    SignalFault,
    scenario_problems,
)
from harness.simulator.workload import LoadCurve, Pod, WorkloadState, place_replicas


@dataclass(frozen=True)
class PodSpec:
    """A request to put pod `namespace/name` (serving `workload`) on GPUs `gpus` of `node`."""

    namespace: str
    name: str
    node: str
    gpus: tuple[int, ...]
    workload: str
    container: str | None = None


class MappingError(ValueError):
    """A pod mapping is impossible; `field` names the offending input, `conflict` marks a GPU already held."""

    def __init__(self, field: str, message: str, *, conflict: bool = False) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.conflict = conflict


def set_signal(g: Gpu, kind: str, value: float | None, error_code: int, *, nvlink: bool = True) -> None:
    """Start (`value`) or end (None) a SignalFault on one GPU; the end restores a healthy reading
    (`nvlink`: an HGX board's, else a PCIe-only card's: Fabric Manager and fabric mask not supported)."""
    on = value is not None
    v = value or 0.0
    if kind == "nvlink_errors":
        g.nvlink_error_rate = v
    elif kind == "pcie_replay":
        g.pcie_replay_rate = v
    elif kind == "clock_event":
        g.clock_reasons = int(v)
    elif kind == "thermal_margin":
        g.margin_override = v if on else None
    elif kind == "fabric_manager":
        g.fm_status, g.fm_error = (int(v), error_code) if on else (3 if nvlink else 0, 0)
    elif kind == "fabric_health":
        g.fabric_mask = int(v) if on else (0x1AA if nvlink else 0)
    elif kind == "exporter_stall":
        g.stalled = on


class Fleet:
    """All simulated nodes and workloads; see the module docstring for how time advances."""

    def __init__(self, scenario: Scenario, *, start: float) -> None:
        problems = scenario_problems(scenario)
        if problems:
            raise ConfigError(problems)
        self.scenario = scenario
        self.model: GpuModel = scenario.fleet.gpu
        self.tick = scenario.exporter.tick
        self.xid_window = scenario.exporter.xid_count_window
        self.start = self.now = start
        self.step = 0
        self.version = 0
        self.nodes: dict[str, Node] = build_nodes(scenario.fleet)
        self.workloads: dict[tuple[str, str], WorkloadState] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.xid_gpus: set[Gpu] = set()  # GPUs with XID events inside the count window
        self._expiry: dict[tuple[str, str, int | None], float | None] = {}  # active timed conditions
        self._schedule = sorted(scenario.faults, key=lambda f: f.at)
        self._next_fault = 0
        for w in scenario.workloads:
            curve = LoadCurve(tuple((p.at, p.qps) for p in w.load), start, w.loop)
            self.set_load(
                w.namespace,
                w.name,
                curve,
                qps_per_gpu=w.qps_per_gpu,
                memory_mib_per_gpu=w.memory_mib_per_gpu,
                container=w.container or w.name,
            )
        names = list(self.nodes)
        self.set_pods(
            [
                PodSpec(
                    scenario.workloads[p.workload_index].namespace,
                    p.pod,
                    names[p.node_index],
                    p.gpus,
                    scenario.workloads[p.workload_index].name,
                )
                for p in place_replicas(scenario)
            ],
            replace=False,
        )
        self._run_due(start)
        self._refresh()

    # -- time -------------------------------------------------------------------------------------------
    def advance(self, now: float) -> bool:
        """Move to the last whole tick at or before `now`; True when simulated time moved."""
        step = int((now - self.start) // self.tick)
        if step <= self.step:
            return False
        t = self.start + step * self.tick
        self._integrate(self.now, t)
        self.now, self.step = t, step
        self._run_due(t)
        self._refresh()
        return True

    def _integrate(self, t0: float, t1: float) -> None:
        dt = t1 - t0
        for w in self.workloads.values():
            if w.gateway:
                w.gateway_requests += (w.curve.qps(t0) + w.curve.qps(t1)) / 2 * dt
            if w.pods:
                per_pod = (w.pod_qps(t0) + w.pod_qps(t1)) / 2 * dt
                for pod in w.pods.values():
                    pod.requests += per_pod
                    pod.cpu_seconds += (pod.cpu_cores(t0) + pod.cpu_cores(t1)) / 2 * dt
        k = dt * 1000.0  # W * s -> mJ
        for node in self.nodes.values():
            for g in node.gpus:
                if not g.stalled:
                    g.energy_mj += g.power_w * k
                g.nvlink_crc_flit += g.nvlink_error_rate * dt
                g.pcie_replays += g.pcie_replay_rate * dt

    def _run_due(self, t: float) -> None:
        """Apply due scheduled faults and expire timed conditions, in time order."""
        while True:
            nxt = self._schedule[self._next_fault] if self._next_fault < len(self._schedule) else None
            due_at = self.start + nxt.at if nxt is not None else None
            expiring = [(at, key) for key, at in self._expiry.items() if at is not None and at <= t]
            first_exp = min(expiring, key=lambda e: e[0]) if expiring else None
            if (
                nxt is not None
                and due_at is not None
                and due_at <= t
                and (first_exp is None or due_at <= first_exp[0])
            ):
                self._next_fault += 1
                self.apply_fault(nxt, due_at)
            elif first_exp is not None:
                self._clear_condition(first_exp[1])
            else:
                return

    def _refresh(self) -> None:
        """Recompute gauges of GPUs that pods hold, and drop XID events older than the count window."""
        for pod in self.pods.values():
            util = pod.gpu_util(self.now)
            for i in pod.gpus:
                set_readings(self.nodes[pod.node].gpus[i], self.model, util, pod.workload.memory_mib_per_gpu)
        horizon = self.now - self.xid_window
        for g in list(self.xid_gpus):
            while g.xid_events and g.xid_events[0][0] <= horizon:
                g.xid_events.popleft()
            if not g.xid_events:
                self.xid_gpus.discard(g)

    # -- faults -----------------------------------------------------------------------------------------
    def target_problem(self, node: str, gpu: int | None) -> tuple[str, str] | None:
        """(field, message) saying why (node, gpu) is not a valid target, or None."""
        if node not in self.nodes:
            return "node", f"unknown node {node!r}"
        if gpu is not None and gpu >= len(self.nodes[node].gpus):
            return "gpu", f"GPU {gpu} does not exist on {node} ({len(self.nodes[node].gpus)} GPUs)"
        return None

    def _targets(self, node: str, gpu: int | None) -> list[Gpu]:
        gpus = self.nodes[node].gpus
        return list(gpus) if gpu is None else [gpus[gpu]]

    def apply_fault(self, fault: Fault, at: float) -> None:
        """Apply one fault at time `at` (events are stamped with it; timed conditions expire after it)."""
        self.version += 1
        if isinstance(fault, ExporterDownFault):
            self.nodes[fault.node].exporter_up = False
            self._expiry[("exporter_down", fault.node, None)] = (
                at + fault.duration if fault.duration else None
            )
            return
        if isinstance(fault, NvswitchFault):
            self.nodes[fault.node].nvswitch_sxid[fault.switch] = (fault.sxid, fault.fatal)
            key = (f"nvswitch-{fault.switch}", fault.node, None)
            self._expiry[key] = at + fault.duration if fault.duration else None
            return
        if isinstance(fault, SignalFault):
            for g in self._targets(fault.node, fault.gpu):
                set_signal(g, fault.kind, fault.value, fault.error_code, nvlink=self.model.nvlink)
                self._expiry[(fault.kind, g.node, g.index)] = at + fault.duration if fault.duration else None
            return
        for g in self._targets(fault.node, fault.gpu):
            if fault.kind == "xid":
                g.last_xid = fault.code
                g.xid_events.extend([(at, fault.code)] * fault.count)
                self.xid_gpus.add(g)
            elif fault.kind == "ecc":
                if fault.error == "sbe":
                    g.ecc_sbe_vol += fault.count
                    g.ecc_sbe_agg += fault.count
                else:
                    g.ecc_dbe_vol += fault.count
                    g.ecc_dbe_agg += fault.count
            elif fault.kind == "retired_pages":
                g.retired_sbe += fault.sbe
                g.retired_dbe += fault.dbe
                g.retired_pending += fault.pending
            elif fault.kind == "remapped_rows":
                g.remapped_correctable += fault.correctable
                g.remapped_uncorrectable += fault.uncorrectable
            else:  # row_remap_failure, gpu_missing: conditions, possibly timed
                if fault.kind == "row_remap_failure":
                    g.row_remap_failure = 1
                else:
                    g.present = False
                self._expiry[(fault.kind, g.node, g.index)] = at + fault.duration if fault.duration else None

    def _clear_condition(self, key: tuple[str, str, int | None]) -> None:
        kind, node, gpu = key
        self._expiry.pop(key, None)
        self.version += 1
        if kind == "exporter_down":
            self.nodes[node].exporter_up = True
        elif kind.startswith("nvswitch-"):
            self.nodes[node].nvswitch_sxid.pop(int(kind.removeprefix("nvswitch-")), None)
        elif gpu is not None and kind in SIGNAL_KINDS:
            set_signal(self.nodes[node].gpus[gpu], kind, None, 0, nvlink=self.model.nvlink)
        elif gpu is not None and kind == "row_remap_failure":
            self.nodes[node].gpus[gpu].row_remap_failure = 0
        elif gpu is not None:
            self.nodes[node].gpus[gpu].present = True

    def clear_faults(self, node: str | None = None, gpu: int | None = None, *, reset: bool = False) -> int:
        """End conditions (exporter down, GPU missing, row-remap failure) on the target; returns how many.

        `reset` also simulates a GPU reset / driver reload: the sticky XID and the XID window, volatile ECC
        counters and pending retirements go back to zero. Aggregate (persistent) counters, retired pages and
        remapped rows survive a reset, as on real hardware.
        """
        cleared = 0
        for key in list(self._expiry):
            _kind, k_node, k_gpu = key
            if (node is not None and k_node != node) or (gpu is not None and k_gpu != gpu):
                continue  # a GPU-scoped clear leaves the node's exporter_down (k_gpu None) alone
            self._clear_condition(key)
            cleared += 1
        if reset:
            nodes = self.nodes.values() if node is None else [self.nodes[node]]
            for n in nodes:
                for g in self._targets(n.name, gpu):
                    g.last_xid = None
                    g.xid_events.clear()
                    self.xid_gpus.discard(g)
                    g.ecc_sbe_vol = g.ecc_dbe_vol = g.retired_pending = 0
        self.version += 1
        return cleared

    def active_conditions(self) -> list[tuple[str, str, int | None, float | None]]:
        """(kind, node, gpu, expires_at) of every active condition, sorted."""
        return sorted(
            ((k, n, g, at) for (k, n, g), at in self._expiry.items()), key=lambda c: (c[1], c[2] or -1, c[0])
        )

    # -- load and pods ----------------------------------------------------------------------------------
    def set_load(
        self,
        namespace: str,
        name: str,
        curve: LoadCurve,
        *,
        qps_per_gpu: float | None = None,
        memory_mib_per_gpu: int | None = None,
        container: str | None = None,
        gateway: bool = True,
    ) -> WorkloadState:
        """Create the workload or change its load curve (and optionally capacity / memory); `gateway`
        False only for a workload created because a pod of it was mapped (no load was ever set)."""
        w = self.workloads.get((namespace, name))
        if w is None:
            w = self.workloads[(namespace, name)] = WorkloadState(
                namespace, name, curve, container=container or name, gateway=gateway
            )
        w.gateway = w.gateway or gateway
        w.curve = curve
        if qps_per_gpu is not None:
            w.qps_per_gpu = qps_per_gpu
        if memory_mib_per_gpu is not None:
            w.memory_mib_per_gpu = memory_mib_per_gpu
        self.version += 1
        self._refresh()
        return w

    def set_pods(self, specs: Sequence[PodSpec], *, replace: bool) -> None:
        """Map pods to GPUs; `replace` makes `specs` the whole mapping. Raises MappingError."""
        final: dict[tuple[str, str], PodSpec] = (
            {}
            if replace
            else {
                key: PodSpec(p.namespace, p.name, p.node, p.gpus, p.workload.name, p.container)
                for key, p in self.pods.items()
            }
        )
        for i, s in enumerate(specs):
            problem = self.target_problem(s.node, max(s.gpus) if s.gpus else None)
            if problem:
                raise MappingError(f"pods[{i}].{'gpus' if problem[0] == 'gpu' else 'node'}", problem[1])
            if not s.gpus or len(set(s.gpus)) != len(s.gpus) or min(s.gpus) < 0:
                raise MappingError(f"pods[{i}].gpus", "must be a non-empty list of distinct GPU indices")
            final[(s.namespace, s.name)] = s
        holder: dict[tuple[str, int], tuple[str, str]] = {}
        for key, s in final.items():
            for g in s.gpus:
                other = holder.setdefault((s.node, g), key)
                if other != key:
                    raise MappingError(
                        "pods",
                        f"GPU {g} of {s.node} claimed by both {'/'.join(other)} and {'/'.join(key)}",
                        conflict=True,
                    )
        for key in [k for k in self.pods if k not in final]:
            self._unmap(key)
        for key, s in final.items():
            old = self.pods.get(key)
            if old is not None and (old.node, old.gpus, old.workload.name) == (s.node, s.gpus, s.workload):
                continue
            requests = old.requests if old is not None else 0.0
            if old is not None:
                self._unmap(key)
            w = self.workloads.get((s.namespace, s.workload))
            if w is None:
                w = self.set_load(s.namespace, s.workload, LoadCurve.constant(0.0, self.now), gateway=False)
            pod = Pod(s.namespace, s.name, s.container or w.container, w, s.node, s.gpus, requests)
            self.pods[key] = w.pods[s.name] = pod
            for g in s.gpus:
                self.nodes[s.node].gpus[g].pod = pod
        self.version += 1
        self._refresh()

    def _unmap(self, key: tuple[str, str]) -> None:
        pod = self.pods.pop(key)
        pod.workload.pods.pop(pod.name, None)
        for i in pod.gpus:
            g = self.nodes[pod.node].gpus[i]
            g.pod = None
            set_readings(g, self.model, 0.0, 0)

    def unmap_pods(self, keys: Iterable[tuple[str, str]]) -> int:
        """Remove pods (as if deleted); unknown pods are ignored. Returns how many were removed."""
        removed = 0
        for key in keys:
            if key in self.pods:
                self._unmap(key)
                removed += 1
        self.version += 1
        self._refresh()
        return removed
