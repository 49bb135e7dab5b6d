"""Grading: which fabric and degradation signals hold on a node now, and which of them count after debounce.

Why separate from `findings.py`: XID and ECC evidence acts on one sample; these signals are graded
(quarantine / degrade / observe per `health.signals.<name>.action`), debounced over consecutive passes and
silenced during a node's boot grace, and that bookkeeping is its own question. `decide.py` turns the
confirmed `quarantine` hits into findings (so the breaker, release and records work as for XIDs) and the
`degrade` hits into the `GPUDegraded` condition (`degrade.py`).

Rules kept here and table-tested (tests/unit/test_health_grading.py):
- thresholds per signal; packed fields decoded bit by bit (`signals.py`), never "non-zero = bad";
- a GPU without NVLink is never flagged for NVLink: an NVLink signal needs the GPU's own NVLink counters
  (dcgm-exporter skips blank values, so a PCIe-only GPU has none) — absence is never a link fault;
- boot grace: signals with `boot_grace` are ignored for `boot_grace_seconds` after the node's Ready condition
  last turned True (a reboot or a kubelet restart), and their streaks restart;
- a stalled exporter (fresh samples, frozen values) is reported by `stalled()`; the node is then unknown.

What it must not do: no I/O, no clock reads, no actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.health.debounce import advance, streak_key
from controller.health.signals import (
    CLOCK_EVENT_SIGNALS,
    SignalName,
    clock_event_reasons,
    fabric_health_faults,
    fabric_manager_status,
)
from controller.health.snapshot import GpuTelemetry, NodeState, Streak
from gpuwarden.config.health_signals import SignalPolicy, SignalsConfig


@dataclass(frozen=True, slots=True)
class SignalHit:
    """One signal holding on one GPU (`gpu=""`: node-level, e.g. an NVSwitch or admission failures)."""

    signal: SignalName
    gpu: str
    value: float
    why: str

    def key(self, node: str) -> str:
        return streak_key(node, self.signal, self.gpu)

    @property
    def reason(self) -> str:
        """The reason string used in taints, records, Events and metrics: `nvlink-errors`."""
        return self.signal.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Graded:
    """A hit that held this pass, with its action and whether its debounce is complete."""

    hit: SignalHit
    action: str
    count: int
    needed: int
    since: float

    @property
    def confirmed(self) -> bool:
        return self.count >= self.needed


@dataclass
class FleetGrading:
    """Per node: the graded hits (confirmed or still debouncing) and why some were silenced."""

    graded: dict[str, tuple[Graded, ...]] = field(default_factory=dict)
    in_grace: dict[str, tuple[SignalHit, ...]] = field(default_factory=dict)
    streaks: dict[str, Streak] = field(default_factory=dict)

    def confirmed(self, node: str, action: str) -> tuple[Graded, ...]:
        return tuple(g for g in self.graded.get(node, ()) if g.confirmed and g.action == action)

    def pending(self, node: str) -> tuple[Graded, ...]:
        return tuple(g for g in self.graded.get(node, ()) if not g.confirmed)


def policy_of(cfg: SignalsConfig, signal: SignalName) -> SignalPolicy:
    policy = getattr(cfg, signal)
    assert isinstance(policy, SignalPolicy)
    return policy


def _on(cfg: SignalsConfig, signal: SignalName) -> bool:
    return policy_of(cfg, signal).action != "off"


def gpu_hits(gpu: GpuTelemetry, cfg: SignalsConfig) -> list[SignalHit]:
    """The signals holding on one (fresh) GPU, thresholds applied."""
    out: list[SignalHit] = []
    u = gpu.uuid
    # NVLink: only from the GPU's own NVLink counters. None = no NVLink series = no NVLink (PCIe-only).
    rate = gpu.nvlink_error_rate
    if rate is not None and _on(cfg, "nvlink_errors") and rate >= cfg.nvlink_errors.errors_per_second:
        out.append(
            SignalHit(
                "nvlink_errors",
                u,
                rate,
                f"NVLink errors {rate:.0f}/s >= {cfg.nvlink_errors.errors_per_second:g}/s",
            )
        )
    status = gpu.fabric_manager_status
    if status is not None and _on(cfg, "fabric_manager"):
        name = fabric_manager_status(status)
        if name in cfg.fabric_manager.failing_statuses:
            code = f", error code {gpu.fabric_manager_error}" if gpu.fabric_manager_error else ""
            out.append(SignalHit("fabric_manager", u, float(status), f"Fabric Manager status {name}{code}"))
    mask = gpu.fabric_health_mask
    if mask is not None and _on(cfg, "fabric_health"):
        faults = [f for f in fabric_health_faults(mask) if f not in cfg.fabric_health.ignore_faults]
        if faults:
            why = f"fabric health mask 0x{mask:x}: {', '.join(faults)}"
            out.append(SignalHit("fabric_health", u, float(mask), why))
    replay = gpu.pcie_replay_rate
    if replay is not None and _on(cfg, "pcie_replay"):
        per_minute = replay * 60.0
        if per_minute >= cfg.pcie_replay.replays_per_minute:
            why = f"PCIe replays {per_minute:.1f}/min >= {cfg.pcie_replay.replays_per_minute:g}/min"
            out.append(SignalHit("pcie_replay", u, per_minute, why))
    reasons = gpu.clock_event_reasons
    if reasons is not None:
        names = clock_event_reasons(reasons)
        for signal, bit in CLOCK_EVENT_SIGNALS.items():
            if reasons & bit and _on(cfg, signal):
                why = f"clock event {signal} asserted (reasons 0x{reasons:x}: {', '.join(sorted(names))})"
                out.append(SignalHit(signal, u, float(reasons), why))
    margin = gpu.thermal_margin
    if margin is not None and _on(cfg, "thermal_margin") and margin < cfg.thermal_margin.min_celsius:
        why = f"thermal margin {margin:g} °C < {cfg.thermal_margin.min_celsius:g} °C"
        out.append(SignalHit("thermal_margin", u, margin, why))
    return out


def node_hits(node: NodeState, fresh: list[GpuTelemetry], cfg: SignalsConfig) -> list[SignalHit]:
    """Every signal holding on the node now: its fresh GPUs', its NVSwitches', its admission failures."""
    out: list[SignalHit] = []
    for gpu in fresh:
        out.extend(gpu_hits(gpu, cfg))
    if node.nvswitch_fatal and _on(cfg, "nvswitch_fatal"):
        sxids = ", ".join(str(s) for s in node.nvswitch_fatal)
        out.append(
            SignalHit("nvswitch_fatal", "", float(max(node.nvswitch_fatal)), f"NVSwitch fatal SXid {sxids}")
        )
    if node.nvswitch_non_fatal and _on(cfg, "nvswitch_non_fatal"):
        sxids = ", ".join(str(s) for s in node.nvswitch_non_fatal)
        value = float(max(node.nvswitch_non_fatal))
        out.append(SignalHit("nvswitch_non_fatal", "", value, f"NVSwitch non-fatal SXid {sxids}"))
    failures = node.admission_failures
    adm = cfg.admission_failures
    if failures is not None and _on(cfg, "admission_failures") and failures >= adm.min_failures:
        why = (
            f"{failures} pods rejected at admission within {adm.window_seconds:.0f}s (>= {adm.min_failures})"
        )
        out.append(SignalHit("admission_failures", "", float(failures), why))
    return out


def in_boot_grace(node: NodeState, cfg: SignalsConfig, now: float) -> bool:
    return node.ready_since is not None and now - node.ready_since < cfg.boot_grace_seconds


def stalled(node: NodeState, cfg: SignalsConfig) -> tuple[str, ...]:
    """UUIDs of the node's stalled GPUs when they are enough to make it unknown (else ())."""
    if cfg.stall_unknown_count == 0:
        return ()
    gpus = tuple(g.uuid for g in node.gpus or () if g.stalled)
    return gpus if len(gpus) >= cfg.stall_unknown_count else ()


def grade_fleet(
    nodes: Mapping[str, tuple[NodeState, list[GpuTelemetry]]],
    cfg: SignalsConfig,
    previous: Mapping[str, Streak],
    now: float,
) -> FleetGrading:
    """Grade every evaluated node (`nodes`: name → (node, its fresh GPUs); unknown nodes are left out, so
    their streaks carry over unchanged)."""
    out = FleetGrading()
    held: dict[str, tuple[str, SignalHit]] = {}
    for name, (node, fresh) in nodes.items():
        hits = node_hits(node, fresh, cfg)
        grace = in_boot_grace(node, cfg, now)
        silenced = tuple(h for h in hits if grace and policy_of(cfg, h.signal).boot_grace)
        if silenced:
            out.in_grace[name] = silenced
        for h in hits:
            if h not in silenced:
                held[h.key(name)] = (name, h)
    out.streaks = advance(previous, held, set(nodes), now)
    per_node: dict[str, list[Graded]] = {}
    for key, (name, h) in sorted(held.items()):
        streak = out.streaks[key]
        pol = policy_of(cfg, h.signal)
        per_node.setdefault(name, []).append(
            Graded(h, pol.action, streak.count, pol.consecutive, streak.since)
        )
    out.graded = {n: tuple(g) for n, g in per_node.items()}
    return out
