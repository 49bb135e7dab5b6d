"""NVLink domain health benchmark: 100 GB200 NVL72 racks (1,800 trays x 4 GPUs), domains graded per pass.

Prints numbers, asserts nothing about time. The floor is measured in the same run: the same
`plan_quarantine` passes over the same snapshots with domain health off (`domains.enabled: false`: what the
health loop did before domains existed). Domain health adds no Prometheus query (it aggregates the node
grading), so the decision is where its cost is.

Fleet: every GPU carries healthy readings of every fabric field; one tray in every 10th rack has its NVLinks
down (fabric health mask fault + NVLink errors) and one more rack has 3 trays quarantined, so each pass
grades 100 domains, 11 of them degraded. Three passes so the debounces confirm; median of runs per pass.
`grade_domains` is also timed alone (from the pass's grading).

Run: `python -m tests.bench domains` (or `make bench`); `GPUWARDEN_BENCH_RACKS=10` for a quicker run.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from typing import Any

from controller.health.decide import plan_quarantine
from controller.health.domains import grade_domains, is_domain_key
from controller.health.grading import grade_fleet
from controller.health.policy import HealthPolicy
from controller.health.snapshot import FleetSnapshot, GpuTelemetry, NodeState, Streak, Taint
from gpuwarden.config.domains import DomainsConfig
from gpuwarden.wellknown import QUARANTINE_TAINT
from harness.simulator import racks as nvl72
from tests.bench.summary import record

RACKS = int(os.environ.get("GPUWARDEN_BENCH_RACKS", "100"))
RUNS = 5


def snapshot(now: float) -> FleetSnapshot:
    nodes = []
    for i, (name, clique) in enumerate(nvl72.trays(RACKS)):
        rack, tray = divmod(i, nvl72.TRAYS_PER_RACK)
        down = rack % 10 == 0 and tray == 3
        gpus = []
        for g in range(nvl72.GPUS_PER_TRAY):
            fields: dict[str, Any] = dict(
                nvlink_error_rate=0.0, pcie_replay_rate=0.0, clock_event_reasons=0x1, thermal_margin=30.0,
                fabric_manager_status=3, fabric_manager_error=0, fabric_health_mask=0x1AA,
            )  # fmt: skip
            if down:
                fields |= {"fabric_health_mask": nvl72.NVLINKS_DOWN_MASK, "nvlink_error_rate": 5000.0}
            gpus.append(GpuTelemetry(f"GPU-{i}-{g}", str(g), now - 3, **fields))
        taints = (Taint(QUARANTINE_TAINT, "xid-79", "NoSchedule"),) if rack == 1 and tray < 3 else ()
        nodes.append(NodeState(name, labels={nvl72.CLIQUE_LABEL: clique}, taints=taints,
                               gpu_capacity=nvl72.GPUS_PER_TRAY, boot_id="b", gpus=tuple(gpus)))  # fmt: skip
    return FleetSnapshot(now, tuple(nodes))


def passes(base: FleetSnapshot, policy: HealthPolicy, now: float) -> tuple[list[float], Any]:
    """Median ms per pass (1, 2, 3) over RUNS runs, and the last third-pass plan."""
    per_pass: list[list[float]] = [[], [], []]
    plan = None
    for _ in range(RUNS):
        streaks: dict[str, Streak] = {}
        for p in range(3):
            snap = replace(base, streaks=streaks, taken_at=now + 10 * p)
            t0 = time.perf_counter()
            plan = plan_quarantine(snap, policy, now + 10 * p)
            per_pass[p].append(time.perf_counter() - t0)
            streaks = plan.streaks
    return [statistics.median(t) * 1000 for t in per_pass], plan


def main() -> None:
    now = time.time()
    base = snapshot(now)
    trays = len(base.nodes)
    third: dict[str, float] = {}
    for label, domains in (
        ("domains off (floor)", DomainsConfig(enabled=False)),
        ("domains on", DomainsConfig()),
    ):
        policy = HealthPolicy(breaker_max_absolute=500, domains=domains)
        med, plan = passes(base, policy, now)
        degraded = sum(1 for d in plan.domains if d.published)
        print(f"plan_quarantine, {label}: {RACKS} racks = {trays} trays x {nvl72.GPUS_PER_TRAY} GPUs: median "
              f"per pass {med[0]:.1f} / {med[1]:.1f} / {med[2]:.1f} ms; third pass: {len(plan.domains)} "
              f"domains graded, {degraded} published degraded, {len(plan.actions_of('domain-degrade'))} "
              f"member changes, {len(plan.actions_of('quarantine'))} quarantines")  # fmt: skip
        third[label] = med[2]
    # grade_domains alone, from the third pass's grading (what domain health adds to a pass)
    policy = HealthPolicy(breaker_max_absolute=500)
    _, plan = passes(base, policy, now)
    streaks = {k: s for k, s in plan.streaks.items() if not is_domain_key(k)}
    known = {n.name: (n, list(n.gpus or ())) for n in base.nodes}
    grading = grade_fleet(known, policy.signals, streaks, now + 30)
    alone = []
    for _ in range(RUNS * 4):
        t0 = time.perf_counter()
        grade_domains(base.nodes, grading, set(known), policy.domains, {}, now + 30)
        alone.append(time.perf_counter() - t0)
    alone_ms = statistics.median(alone) * 1000
    extra = third["domains on"] - third["domains off (floor)"]
    print(f"grade_domains alone: {alone_ms:.2f} ms per pass for {RACKS} domains ({trays} trays); "
          f"the pass with domains on costs {extra:+.1f} ms over the floor "
          f"({extra / third['domains off (floor)'] * 100:+.0f} %)")  # fmt: skip
    record(
        "domains",
        f"plan_quarantine, third pass, {RACKS} NVL72 racks ({trays:,} trays), domain health on",
        third["domains on"],
        "ms",
        anchor="same pass, domain health off",
        anchor_value=third["domains off (floor)"],
    )
    record("domains", f"grade_domains alone, {RACKS} racks", alone_ms, "ms")


if __name__ == "__main__":
    main()
