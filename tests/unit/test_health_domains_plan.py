"""NVLink domain health through the whole quarantine decision, pass after pass: a tray's fabric fault
degrades its rack after the debounce (label + condition + Event on every member, no taint unless asked),
dry-run plans the same, release waits for healthy to hold, and the member patch touches only our keys."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from controller.health.act import node_patch
from controller.health.decide import plan_quarantine
from controller.health.domains import MemberChange, publication_action
from controller.health.metrics import HealthMetrics
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import FleetSnapshot, NodeState, Streak
from gpuwarden.config.domains import CLIQUE_LABEL, DomainsConfig
from gpuwarden.wellknown import (
    NVLINK_DOMAIN_CONDITION,
    NVLINK_DOMAIN_HEALTH,
    NVLINK_DOMAIN_TAINT,
    QUARANTINE_TAINT,
)
from tests.unit.test_health_fixtures import NOW, node

RACK = "3183419e-9edc-4f0e-86e8-d895a9fb06be.17044"
INTERVAL = 10.0
# A fabric health mask with degraded_bw asserted (bits 0-1 = 1) and the other sub-fields explicitly healthy.
DEGRADED_BW = 0b10_10_10_01 | (1 << 8)


def rack(published: str | None = None, faulty: int | None = None) -> list[NodeState]:
    out = []
    for i in range(18):
        labels = {CLIQUE_LABEL: RACK} | ({NVLINK_DOMAIN_HEALTH: published} if published else {})
        per_gpu = {0: {"fabric_health_mask": DEGRADED_BW}} if i == faulty else None
        out.append(node(f"tray-{i:02d}", gpus=4, capacity=4, labels=labels, per_gpu=per_gpu))
    return out


def run(passes: list[list[NodeState]], **policy: Any) -> list[HealthPlan]:
    pol = HealthPolicy(**policy)
    streaks: dict[str, Streak] = {}
    plans = []
    for i, nodes in enumerate(passes):
        now = NOW + i * INTERVAL
        plan = plan_quarantine(FleetSnapshot(now, tuple(nodes), streaks=streaks), pol, now)
        streaks = plan.streaks
        plans.append(plan)
    return plans


def test_a_tray_fault_degrades_its_rack_after_the_debounce_on_every_member() -> None:
    plans = run([rack(faulty=3)] * 3)
    assert plans[0].actions_of("domain-degrade") == [] and plans[1].actions_of("domain-degrade") == []
    degrade = plans[2].actions_of("domain-degrade")
    assert sorted(a.node for a in degrade) == [f"tray-{i:02d}" for i in range(18)]
    a = degrade[0]
    assert a.domain is not None and (a.domain.label, a.domain.taint) == ("degraded", False)
    assert a.condition is not None and (a.condition.type, a.condition.status) == (
        NVLINK_DOMAIN_CONDITION,
        "False",
    )
    assert a.event is not None and a.event.reason == "NVLinkDomainDegraded" and "tray-03" in a.event.note
    (status,) = plans[2].domains
    assert (status.state, status.published, status.trays) == ("degraded", "degraded", 18)
    assert plans[2].to_dict()["nvlink_domains"][0]["passes"] == "3/3"
    assert f"NVLink domain {RACK}: degraded (3/3 passes, published degraded)" in plans[2].render_table()
    # the faulty tray itself is quarantined by its own signal (fabric_health: quarantine), as before
    assert [q.node for q in plans[2].actions_of("quarantine")] == ["tray-03"]


def test_dry_run_plans_the_same_and_the_loop_streaks_carry_domain_and_node_keys() -> None:
    plans = run([rack(faulty=3)] * 3, dry_run=True)
    assert plans[2].dry_run and len(plans[2].actions_of("domain-degrade")) == 18
    keys = set(plans[2].streaks)
    assert any(k.startswith("domain:") for k in keys) and any(k.startswith("tray-03/") for k in keys)


def test_release_after_healthy_holds_and_a_taint_only_by_option() -> None:
    plans = run([rack(published="degraded")] * 3)
    assert plans[1].actions_of("domain-release") == []
    release = plans[2].actions_of("domain-release")
    assert len(release) == 18 and release[0].domain is not None and release[0].domain.label is None
    cfg = DomainsConfig.model_validate({"health": {"action": "quarantine"}})
    tainted = run([rack(faulty=3)] * 3, domains=cfg)[2].actions_of("domain-degrade")
    assert {a.domain.taint for a in tainted if a.domain} == {True}


def test_prometheus_down_changes_no_domain() -> None:
    pol = HealthPolicy()
    snap = FleetSnapshot(NOW, tuple(rack(published="degraded")), prometheus_ok=False, prometheus_error="down")
    plan = plan_quarantine(snap, pol, NOW)
    assert plan.actions_of("domain-release") == [] and plan.domains[0].state == "unknown"


def member(labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": "tray-00", "labels": labels}, "spec": {"taints": taints}}


def test_member_patch_sets_our_label_and_taint_and_keeps_other_taints() -> None:
    theirs = {"key": "example.com/theirs", "value": "x", "effect": "NoSchedule"}
    ours = {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}
    degrade = publication_action(MemberChange("tray-00", RACK, "degraded", True, "m"))
    patch = node_patch(member({CLIQUE_LABEL: RACK}, [theirs, ours]), degrade)
    assert patch == {
        "metadata": {"labels": {NVLINK_DOMAIN_HEALTH: "degraded"}},
        "spec": {
            "taints": [
                theirs,
                ours,
                {"key": NVLINK_DOMAIN_TAINT, "value": "degraded", "effect": "NoSchedule"},
            ]
        },
    }
    done = member({NVLINK_DOMAIN_HEALTH: "degraded"}, [theirs, ours, patch["spec"]["taints"][2]])
    assert node_patch(done, degrade) is None
    release = publication_action(MemberChange("tray-00", RACK, None, True, "healthy"))
    assert node_patch(done, release) == {
        "metadata": {"labels": {NVLINK_DOMAIN_HEALTH: None}},
        "spec": {"taints": [theirs, ours]},
    }
    excluded = member({"gpuwarden.io/exclude": "true"}, [])
    assert node_patch(excluded, degrade) is None


def test_domain_metric_by_state_and_publication() -> None:
    registry = CollectorRegistry()
    metrics = HealthMetrics(registry)
    passes = [rack(faulty=3)] * 3
    plan = run(passes)[2]
    metrics.observe_pass(FleetSnapshot(NOW, tuple(passes[2])), plan)
    labels = {"domain": RACK, "state": "degraded", "published": "degraded"}
    assert registry.get_sample_value("gpuwarden_health_nvlink_domains", labels) == 18.0
