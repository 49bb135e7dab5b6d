"""The simulated fleet as plain state: nodes, GPUs, health counters, pods on GPUs; time is injected.

Why it exists: health rules, the quarantine controller, the adapter and the demo all need a GPU fleet whose
behaviour is known exactly — sticky XIDs, monotonic ECC counters, faults at given times, utilization that
follows load. This module is that fleet and nothing else: no I/O, no clock reads (time only enters through
`advance(now)`), no text rendering (`exposition.py`), no HTTP (`server.py`, `control.py`).

Time moves in steps of `exporter.tick` seconds: `advance(now)` integrates counters up to the last whole step,
applies scheduled faults that became due (each stamped with its own time) and expires timed conditions.
Run-time changes (faults, load, pods) apply at once and bump `version`, so a cached exposition is never served
after a change.

Shared GPUs (`fleet.sharing`): on a time-sliced node a pod holds a *replica* of a GPU and several pods share
one GPU (its utilization is the sum of their demands, capped at 100 %); on a MIG node a pod holds a *MIG
instance* (its utilization is its demand over the instance's share of the GPU). `PodSpec.slots` names the
replica or instance per GPU entry; left out, the lowest free one is taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpuwarden.errors import ConfigError
from harness.simulator.engine import EngineKind, Engines
from harness.simulator.hardware import Gpu, MigInstance, Node, build_nodes, set_readings
from harness.simulator.scenario import (
    MIG_SLICES_PER_GPU,
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
    slots: tuple[int, ...] | None = None
    """Shared nodes only, one per entry of `gpus`: the replica number n of a time-sliced GPU (device ID
    `<uuid>::<n>`) or the position of a MIG instance on the GPU. None: the lowest free ones. A pod may list a
    GPU twice on a shared node (two replicas or two instances of it)."""


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
        self.xid_gpus: set[Gpu | MigInstance] = set()  # GPUs / instances with XIDs inside the count window
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
                engine=w.engine,
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
            if w.engines is not None and dt > 0:
                capacity = {name: w.qps_per_gpu * len(p.gpus) for name, p in w.pods.items()}
                w.engines.step((w.curve.qps(t0) + w.curve.qps(t1)) / 2, capacity, dt)
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
        shared: dict[Gpu, None] = {}
        for pod in self.pods.values():
            node = self.nodes[pod.node]
            if pod.slots:
                shared.update((node.gpus[i], None) for i in pod.gpus)
                continue
            util = pod.gpu_util(self.now)
            for i in pod.gpus:
                set_readings(node.gpus[i], self.model, util, pod.workload.memory_mib_per_gpu)
        for g in shared:
            self._refresh_shared(g)
        horizon = self.now - self.xid_window
        for entity in list(self.xid_gpus):
            while entity.xid_events and entity.xid_events[0][0] <= horizon:
                entity.xid_events.popleft()
            if not entity.xid_events:
                self.xid_gpus.discard(entity)

    def _refresh_shared(self, g: Gpu) -> None:
        """A shared GPU's readings from every pod on it: time-sliced, the demands of its replicas' holders
        add up (capped at 100 %); MIG, each instance's demand over its share of the GPU, and the GPU's
        power and temperature from the slice-weighted mean of its instances."""
        if g.instances:
            for inst in g.instances:
                if inst.pod is None:
                    inst.set_load(0.0, 0)
                    continue
                n = inst.pod.gpus.count(g.index)
                util = min(100.0, inst.pod.demand(self.now) * MIG_SLICES_PER_GPU / inst.slices)
                inst.set_load(util, inst.pod.workload.memory_mib_per_gpu // max(1, n))
            busy = sum(i.util * i.slices for i in g.instances) / MIG_SLICES_PER_GPU
            used = sum(i.fb_used_mib for i in g.instances)
            set_readings(g, self.model, min(100.0, busy), used)
            return
        demand = sum(pod.demand(self.now) for _, pod in g.holders)
        memory = sum(pod.workload.memory_mib_per_gpu for _, pod in g.holders)
        set_readings(g, self.model, min(100.0, demand), memory)

    def device_ids(self, pod: Pod) -> list[str]:
        """The device-plugin IDs the pod holds, as kubelet's PodResources would list them: the GPU UUID,
        `<uuid>::<n>` for replica n of a time-sliced GPU, the MIG device UUID for a MIG instance."""
        gpus = self.nodes[pod.node].gpus
        out = []
        for n, i in enumerate(pod.gpus):
            g = gpus[i]
            if g.instances:
                out.append(g.instances[pod.slots[n]].mig_uuid)
            elif g.replicas > 1:
                out.append(f"{g.uuid}::{pod.slots[n]}")
            else:
                out.append(g.uuid)
        return out

    def pod_share(self, g: Gpu, pod: Pod) -> float:
        """A time-sliced GPU: the part of its utilization (%) that `pod`'s processes account for (what
        dcgm-exporter's per-process DCGM_FI_DEV_GPU_UTIL gives the pod: 0 for a pod that computes nothing)."""
        demand = sum(p.demand(self.now) for _, p in g.holders)
        if demand <= 0:
            return 0.0
        mine = sum(p.demand(self.now) for _, p in g.holders if p is pod)
        return g.util * mine / demand

    # -- faults -----------------------------------------------------------------------------------------
    def target_problem(
        self, node: str, gpu: int | None, instance: int | None = None
    ) -> tuple[str, str] | None:
        """(field, message) saying why (node, gpu[, MIG instance]) is not a valid target, or None."""
        if node not in self.nodes:
            return "node", f"unknown node {node!r}"
        if gpu is not None and gpu >= len(self.nodes[node].gpus):
            return "gpu", f"GPU {gpu} does not exist on {node} ({len(self.nodes[node].gpus)} GPUs)"
        if instance is not None:
            count = len(self.nodes[node].gpus[0].instances)
            if instance >= count:
                return "instance", f"MIG instance {instance} does not exist on {node} ({count} per GPU)"
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
                # On a MIG GPU an XID attributed to an instance is that instance's; one that is not is the
                # GPU's, whose entity dcgm-exporter's default mode does not watch there (no series shows it).
                target: Gpu | MigInstance = g
                if g.instances and fault.instance is not None:
                    target = g.instances[fault.instance]
                target.last_xid = fault.code
                target.xid_events.extend([(at, fault.code)] * fault.count)
                self.xid_gpus.add(target)
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
                    entities: list[Gpu | MigInstance] = [g, *g.instances]
                    for entity in entities:
                        entity.last_xid = None
                        entity.xid_events.clear()
                        self.xid_gpus.discard(entity)
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
        engine: EngineKind | None = None,
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
        if engine is not None and (w.engines is None or w.engines.kind != engine):
            w.engines = Engines(engine)
        self.version += 1
        self._refresh()
        return w

    def set_pods(self, specs: Sequence[PodSpec], *, replace: bool) -> None:
        """Map pods to GPUs (replicas or MIG instances on shared nodes); `replace` makes `specs` the whole
        mapping. Raises MappingError."""
        final: dict[tuple[str, str], PodSpec] = (
            {}
            if replace
            else {
                key: PodSpec(
                    p.namespace, p.name, p.node, p.gpus, p.workload.name, p.container, p.slots or None
                )
                for key, p in self.pods.items()
            }
        )
        for i, s in enumerate(specs):
            problem = self.target_problem(s.node, max(s.gpus) if s.gpus else None)
            if problem:
                raise MappingError(f"pods[{i}].{'gpus' if problem[0] == 'gpu' else 'node'}", problem[1])
            final[(s.namespace, s.name)] = self._checked_spec(i, s)
        final = self._resolve_slots(final)
        for key in [k for k in self.pods if k not in final]:
            self._unmap(key)
        for key, s in final.items():
            old = self.pods.get(key)
            slots = s.slots or ()
            if old is not None and (old.node, old.gpus, old.workload.name, old.slots) == (
                s.node,
                s.gpus,
                s.workload,
                slots,
            ):
                continue
            requests = old.requests if old is not None else 0.0
            if old is not None:
                self._unmap(key)
            w = self.workloads.get((s.namespace, s.workload))
            if w is None:
                w = self.set_load(s.namespace, s.workload, LoadCurve.constant(0.0, self.now), gateway=False)
            container = s.container or w.container
            pod = Pod(s.namespace, s.name, container, w, s.node, s.gpus, requests, slots=slots)
            self.pods[key] = w.pods[s.name] = pod
            gpus = self.nodes[s.node].gpus
            for n, g in enumerate(s.gpus):
                gpu = gpus[g]
                if gpu.instances:
                    gpu.instances[slots[n]].pod = pod
                elif gpu.replicas > 1:
                    gpu.holders.append((slots[n], pod))
                    gpu.pod = pod  # dcgm-exporter's default: the last pod listed for the GPU wins
                else:
                    gpu.pod = pod
        self.version += 1
        self._refresh()

    def _checked_spec(self, i: int, s: PodSpec) -> PodSpec:
        """`s` with its GPU entries checked against the node's sharing; raises MappingError."""
        gpu0 = self.nodes[s.node].gpus[0]
        if not gpu0.shared:
            if not s.gpus or len(set(s.gpus)) != len(s.gpus) or min(s.gpus) < 0:
                raise MappingError(f"pods[{i}].gpus", "must be a non-empty list of distinct GPU indices")
            if s.slots:
                raise MappingError(f"pods[{i}].slots", f"{s.node} does not share its GPUs")
            return s
        if not s.gpus or min(s.gpus) < 0:
            raise MappingError(f"pods[{i}].gpus", "must be a non-empty list of GPU indices")
        if s.slots is not None:
            size = len(gpu0.instances) or gpu0.replicas
            what = "MIG instances" if gpu0.instances else "replicas"
            if len(s.slots) != len(s.gpus):
                raise MappingError(f"pods[{i}].slots", "needs one entry per entry of `gpus`")
            if any(not 0 <= n < size for n in s.slots):
                raise MappingError(f"pods[{i}].slots", f"{s.node} has {size} {what} per GPU (0..{size - 1})")
            if len(set(zip(s.gpus, s.slots, strict=True))) != len(s.gpus):
                raise MappingError(f"pods[{i}].slots", "lists one replica or instance twice")
        return s

    def _resolve_slots(self, final: dict[tuple[str, str], PodSpec]) -> dict[tuple[str, str], PodSpec]:
        """Every spec with its slots fixed (kept from the current mapping, else the lowest free ones), or
        MappingError(conflict) when one GPU, replica or instance is claimed twice."""
        holder: dict[tuple[str, int, int], tuple[str, str]] = {}

        def claim(key: tuple[str, str], node: str, g: int, n: int) -> None:
            other = holder.setdefault((node, g, n), key)
            if other != key:
                gpu0 = self.nodes[node].gpus[0]
                what = (
                    f"GPU {g}"
                    if not gpu0.shared
                    else (f"MIG instance {n} of GPU {g}" if gpu0.instances else f"replica {n} of GPU {g}")
                )
                raise MappingError(
                    "pods", f"{what} of {node} claimed by both {'/'.join(other)} and {'/'.join(key)}",
                    conflict=True,
                )  # fmt: skip

        pending: list[tuple[str, str]] = []
        out = dict(final)
        for key, s in final.items():
            if not self.nodes[s.node].gpus[0].shared:
                for g in s.gpus:
                    claim(key, s.node, g, 0)
                continue
            slots = s.slots
            old = self.pods.get(key)
            if slots is None and old is not None and (old.node, old.gpus) == (s.node, s.gpus):
                slots = old.slots
            if slots is None:
                pending.append(key)
                continue
            for g, n in zip(s.gpus, slots, strict=True):
                claim(key, s.node, g, n)
            out[key] = replace(s, slots=tuple(slots))
        for key in pending:
            s = final[key]
            gpu0 = self.nodes[s.node].gpus[0]
            size = len(gpu0.instances) or gpu0.replicas
            chosen = []
            for g in s.gpus:
                free = [n for n in range(size) if (s.node, g, n) not in holder]
                if not free:
                    raise MappingError(
                        "pods", f"GPU {g} of {s.node} has no free replica or instance for {'/'.join(key)}",
                        conflict=True,
                    )  # fmt: skip
                claim(key, s.node, g, free[0])
                chosen.append(free[0])
            out[key] = replace(s, slots=tuple(chosen))
        return out

    def _unmap(self, key: tuple[str, str]) -> None:
        pod = self.pods.pop(key)
        pod.workload.pods.pop(pod.name, None)
        gpus = self.nodes[pod.node].gpus
        for i in dict.fromkeys(pod.gpus):
            g = gpus[i]
            if g.instances:
                for inst in g.instances:
                    if inst.pod is pod:
                        inst.pod = None
                        inst.set_load(0.0, 0)
                self._refresh_shared(g)
            elif g.replicas > 1:
                g.holders = [(n, p) for n, p in g.holders if p is not pod]
                g.pod = g.holders[-1][1] if g.holders else None
                self._refresh_shared(g)
            else:
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
