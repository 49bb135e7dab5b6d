"""Domain health rules, one row per scenario: which trays' evidence makes an NVLink domain degraded or
failed, what unknown telemetry does, the domain debounce, and which members' publication changes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controller.health.domains import DomainGrading, DomainState, Tray, grade_domains, judge
from controller.health.grading import FleetGrading, Graded, SignalHit, grade_fleet
from controller.health.signals import SignalName
from controller.health.snapshot import GpuTelemetry, NodeState, Streak, Taint
from gpuwarden.config.domains import CLIQUE_LABEL, DomainHealth, DomainsConfig
from gpuwarden.config.health_signals import SignalsConfig
from gpuwarden.wellknown import EXCLUDE, NVLINK_DOMAIN_HEALTH, QUARANTINE_TAINT

NOW = 1_700_000_000.0
RACK = "3183419e-9edc-4f0e-86e8-d895a9fb06be.17044"
CFG = DomainHealth()


def trays(n: int = 18, **special: Tray) -> tuple[Tray, ...]:
    out = [Tray(f"t{i:02d}", True) for i in range(n)]
    for i, t in enumerate(out):
        if t.node in special:
            out[i] = special[t.node]
    return tuple(out)


JUDGE_ROWS: list[tuple[str, tuple[Tray, ...], DomainHealth, DomainState, str]] = [
    ("all-healthy", trays(), CFG, "healthy", ""),
    ("one-tray-lost-bandwidth", trays(t03=Tray("t03", True, bandwidth_lost=("fabric-health on GPU-3",))), CFG,
     "degraded", "t03: fabric-health on GPU-3"),
    ("one-tray-nvlink-errors", trays(t05=Tray("t05", True, bandwidth_lost=("nvlink-errors on GPU-1",))), CFG,
     "degraded", "t05: nvlink-errors"),
    ("one-tray-fabric-manager-failure-is-degraded-not-failed",
     trays(t00=Tray("t00", True, fabric_down=("fabric-manager on GPU-0",))), CFG,
     "degraded", "t00: fabric-manager"),
    ("fabric-down-on-most-trays-is-failed",
     tuple(Tray(f"t{i:02d}", True, fabric_down=("nvswitch-fatal on node",)) for i in range(10))
     + trays(8)[:8],
     CFG, "failed", "fabric down on 10 of 18 trays (> 50%)"),
    ("half-exactly-is-not-failed",
     tuple(Tray(f"d{i:02d}", True, fabric_down=("fabric-manager on GPU-0",)) for i in range(9))
     + trays(9), CFG,
     "degraded", "d00: fabric-manager"),
    ("two-trays-quarantined-within-k", trays(t01=Tray("t01", True, quarantined=True),
                                             t02=Tray("t02", True, quarantined=True)), CFG, "healthy", ""),
    ("three-trays-quarantined-over-k", trays(t01=Tray("t01", True, quarantined=True),
                                             t02=Tray("t02", True, quarantined=True),
                                             t03=Tray("t03", True, quarantined=True)), CFG,
     "degraded", "3 trays out (> 2): 3 quarantined"),
    ("three-trays-missing-over-k", trays(15), CFG, "degraded", "3 trays out (> 2): 3 missing of 18"),
    ("one-quarantined-two-missing-within-k", trays(16, t00=Tray("t00", True, quarantined=True)), CFG,
     "degraded", "3 trays out (> 2): 1 quarantined, 2 missing of 18"),
    ("k-is-configurable", trays(17), DomainHealth(max_trays_out=0), "degraded", "1 missing of 18"),
    ("unknown-tray-makes-an-otherwise-healthy-domain-unknown", trays(t04=Tray("t04", False)), CFG,
     "unknown", "telemetry unknown on t04"),
    ("unknown-tray-evidence-does-not-count", trays(t04=Tray("t04", False, bandwidth_lost=("x",))), CFG,
     "unknown", "t04"),
    ("known-evidence-wins-over-an-unknown-tray",
     trays(t04=Tray("t04", False), t05=Tray("t05", True, bandwidth_lost=("fabric-health on GPU-2",))), CFG,
     "degraded", "t05: fabric-health"),
]  # fmt: skip


@pytest.mark.parametrize(("trays_", "cfg", "state", "why"), [r[1:] for r in JUDGE_ROWS],
                         ids=[r[0] for r in JUDGE_ROWS])  # fmt: skip
def test_judge(trays_: tuple[Tray, ...], cfg: DomainHealth, state: DomainState, why: str) -> None:
    got, reasons = judge(trays_, cfg)
    assert got == state
    assert why in "; ".join(reasons)


# --- grade_domains: the tray evidence from the node grading, the debounce, the member changes ---


@dataclass
class Fleet:
    nodes: list[NodeState] = field(default_factory=list)
    grading: FleetGrading = field(default_factory=FleetGrading)

    def add(self, name: str, clique: str | None = RACK, *, published: str | None = None,
            quarantined: bool = False, excluded: bool = False,
            hits: tuple[tuple[SignalName, str, bool], ...] = ()) -> None:  # fmt: skip
        labels = {CLIQUE_LABEL: clique} if clique else {}
        if published:
            labels[NVLINK_DOMAIN_HEALTH] = published
        if excluded:
            labels[EXCLUDE] = "true"
        taints = (Taint(QUARANTINE_TAINT, "xid-79", "NoSchedule"),) if quarantined else ()
        self.nodes.append(NodeState(name, labels=labels, taints=taints, gpu_capacity=4))
        graded = tuple(
            Graded(SignalHit(signal, "GPU-0", 1.0, f"{signal} holds"), action, 3 if done else 1, 3, NOW)
            for signal, action, done in hits
        )
        if graded:
            self.grading.graded[name] = graded


Hits = tuple[tuple[SignalName, str, bool], ...]


def rack(published: str | None = None, n: int = 18, **hits: Hits) -> Fleet:
    f = Fleet()
    for i in range(n):
        f.add(f"t{i:02d}", published=published, hits=hits.get(f"t{i:02d}", ()))
    return f


DEFAULTS = DomainsConfig()


def run(f: Fleet, passes: int, cfg: DomainsConfig = DEFAULTS, known: set[str] | None = None) -> DomainGrading:
    streaks: dict[str, Streak] = {}
    known = {n.name for n in f.nodes} if known is None else known
    for i in range(passes):
        out = grade_domains(f.nodes, f.grading, known, cfg, streaks, NOW + 30 * i)
        streaks = out.streaks
    return out


def test_a_confirmed_fabric_fault_degrades_the_domain_after_its_debounce() -> None:
    f = rack(t03=(("fabric_health", "quarantine", True),))
    early = run(f, 2)
    assert early.verdicts[RACK].state == "degraded" and not early.verdicts[RACK].confirmed
    assert early.changes == ()
    out = run(f, 3)
    v = out.verdicts[RACK]
    assert (v.confirmed, v.target, v.count) == (True, "degraded", 3)
    assert [c.node for c in out.changes] == [f"t{i:02d}" for i in range(18)]
    assert {(c.label, c.taint) for c in out.changes} == {("degraded", False)}
    assert "t03: fabric-health on GPU-0" in out.changes[0].message


@pytest.mark.parametrize(
    ("hit", "degraded"),
    [
        (("fabric_health", "quarantine", False), True),  # debouncing on the node: the domain's runs alongside
        (("fabric_health", "observe", True), True),  # observe on the node still counts for the domain
        (("pcie_replay", "degrade", True), False),  # not a fabric signal
        (("nvswitch_non_fatal", "observe", True), False),  # informational SXid
        (("nvswitch_fatal", "quarantine", True), True),
    ],
    ids=["node-debouncing-counts", "observe-counts", "pcie-not-fabric", "non-fatal-sxid", "fatal-sxid"],
)
def test_which_node_hits_count(hit: tuple[SignalName, str, bool], degraded: bool) -> None:
    out = run(rack(t07=(hit,)), 3)
    assert (out.verdicts[RACK].target == "degraded") is degraded


def test_boot_grace_silences_fabric_manager_not_started_through_the_node_grading() -> None:
    signals = SignalsConfig.model_validate({"fabric_manager": {"failing_statuses": ["not_started", "failure"],
                                                               "consecutive": 1}})  # fmt: skip
    booting = NodeState("t00", labels={CLIQUE_LABEL: RACK}, gpu_capacity=4, ready_since=NOW - 60,
                        gpus=(GpuTelemetry("GPU-0", fabric_manager_status=1),))  # fmt: skip
    up = NodeState("t00", labels={CLIQUE_LABEL: RACK}, gpu_capacity=4, ready_since=NOW - 3600,
                   gpus=(GpuTelemetry("GPU-0", fabric_manager_status=1),))  # fmt: skip
    cfg = DomainsConfig.model_validate({"health": {"consecutive": 1, "expected_trays": 1}})
    for node, state in ((booting, "healthy"), (up, "failed")):  # one tray of one: the fabric
        grading = grade_fleet({"t00": (node, list(node.gpus or ()))}, signals, {}, NOW)
        out = grade_domains([node], grading, {"t00"}, cfg, {}, NOW)
        assert out.verdicts[RACK].state == state


def test_release_waits_for_healthy_to_hold_and_unknown_holds_everything() -> None:
    published = rack(published="degraded")
    first = run(published, 2)
    assert first.verdicts[RACK].state == "healthy" and first.changes == ()
    released = run(published, 3)
    assert {(c.label, c.message) for c in released.changes} == {(None, f"NVLink domain {RACK} is healthy")}
    unknown = run(rack(published="degraded"), 5, known=set())
    assert unknown.verdicts[RACK].state == "unknown" and unknown.changes == ()


def test_unknown_pass_keeps_the_domain_streak() -> None:
    f = rack(t03=(("fabric_health", "quarantine", True),))
    cfg = DomainsConfig()
    names = {n.name for n in f.nodes}
    a = grade_domains(f.nodes, f.grading, names, cfg, {}, NOW)
    b = grade_domains(f.nodes, f.grading, names - {"t00"}, cfg, a.streaks, NOW + 30)  # t03 evidence wins
    assert b.verdicts[RACK].count == 2
    quiet = rack()
    c = grade_domains(quiet.nodes, quiet.grading, set(), cfg, b.streaks, NOW + 60)  # all unknown
    assert c.verdicts[RACK].state == "unknown" and c.streaks == b.streaks


def test_failed_is_published_as_failed_and_taint_only_by_option() -> None:
    f = rack(**{f"t{i:02d}": (("fabric_manager", "quarantine", True),) for i in range(12)})
    cfg = DomainsConfig.model_validate({"health": {"action": "quarantine"}})
    out = run(f, 3, cfg)
    assert out.verdicts[RACK].target == "failed"
    assert {(c.label, c.taint) for c in out.changes} == {("failed", True)}


def test_observe_and_off_publish_nothing_and_excluded_members_are_left_alone() -> None:
    f = rack(t03=(("fabric_health", "quarantine", True),))
    observe = run(f, 3, DomainsConfig.model_validate({"health": {"action": "observe"}}))
    assert observe.verdicts[RACK].target == "degraded" and observe.changes == ()
    assert run(f, 3, DomainsConfig.model_validate({"health": {"action": "off"}})).verdicts == {}
    f.add("t18", excluded=True)
    assert "t18" not in {c.node for c in run(f, 3).changes}


def test_a_node_that_left_its_domain_loses_our_label_and_domains_stay_apart() -> None:
    f = rack()
    f.add("moved", clique=None, published="degraded")
    other = "bbc2edac-0000-4f0e-86e8-d895a9fb06be.17044"  # same clique id, another rack
    for i in range(18):
        f.add(f"b{i:02d}", clique=other, hits=(("nvlink_errors", "quarantine", True),) if i == 0 else ())
    out = run(f, 3)
    assert out.verdicts[RACK].target is None and out.verdicts[other].target == "degraded"
    assert ("moved", None) in {(c.node, c.label) for c in out.changes}
    assert {c.domain for c in out.changes if c.label} == {other}
