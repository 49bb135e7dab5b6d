"""Device-scoped quarantine on DRA-backed nodes (controller/health/devicerules.py and its use in decide):
which scope, which rules, and the rule sync - one row per scenario."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controller.health import devicerules
from controller.health.decide import plan_quarantine
from controller.health.plan import Action, RuleSpec, RuleSync
from controller.health.policy import HealthPolicy
from controller.health.snapshot import DeviceRulesApi, FleetSnapshot, NodeState, OwnedRule, Taint
from gpuwarden.quarantine import DeviceRef, QuarantineRecord
from gpuwarden.wellknown import DEVICE_RULE_NODE, MANAGED_BY_LABEL, QUARANTINE_TAINT
from tests.unit.test_health_fixtures import NOW, node, record

DRIVER, POOL = "gpu.nvidia.com", "n1"


def dev(i: int, node_name: str = "n1") -> DeviceRef:
    return DeviceRef(DRIVER, node_name, f"gpu-{i}", f"GPU-{node_name}-{i}")


DEVICES = {f"GPU-n1-{i}": dev(i) for i in range(8)}


def dra_node(**kw: Any) -> NodeState:
    """n1 as a DRA-backed node: no nvidia.com/gpu capacity, its 8 GPUs in its ResourceSlices."""
    devices = kw.pop("devices", DEVICES)
    return replace(node("n1", capacity=0, **kw), dra_devices=devices)


def snap(
    *nodes: NodeState, api: DeviceRulesApi = "served", owned: tuple[OwnedRule, ...] = ()
) -> FleetSnapshot:
    return FleetSnapshot(NOW, tuple(nodes), device_rules=api, device_rules_why="x", owned_rules=owned)


# --- scope_of ---


@pytest.mark.parametrize(
    ("devices", "gpus", "api", "want_devices", "note"),
    [
        pytest.param(None, ["GPU-n1-0"], "served", (), "", id="device-plugin-node-no-note"),
        pytest.param(DEVICES, ["GPU-n1-0"], "served", (dev(0),), "", id="one-faulty-device"),
        pytest.param(
            DEVICES,
            ["GPU-n1-3", "GPU-n1-0", "GPU-n1-3"],
            "served",
            (dev(0), dev(3)),
            "",
            id="two-devices-deduplicated",
        ),
        pytest.param(DEVICES, ["GPU-n1-0"], "not-served", (), "not served", id="api-404-node-level"),
        pytest.param(DEVICES, ["GPU-n1-0"], "unknown", (), "could not be read", id="api-unknown-node-level"),
        pytest.param(
            DEVICES, ["GPU-n1-0", ""], "served", (), "node-level evidence", id="node-level-evidence"
        ),
        pytest.param(DEVICES, [], "served", (), "node-level evidence", id="no-gpu-named"),
        pytest.param(DEVICES, ["GPU-n1-9"], "served", (), "GPU-n1-9 not in", id="uuid-not-in-slices"),
        pytest.param({}, ["GPU-n1-0"], "served", (), "not in", id="slices-unread-node-level"),
    ],
)
def test_scope_of(
    devices: dict[str, DeviceRef] | None,
    gpus: list[str],
    api: DeviceRulesApi,
    want_devices: tuple[DeviceRef, ...],
    note: str,
) -> None:
    scope = devicerules.scope_of(devices, gpus, api, "x")
    assert scope.devices == want_devices
    assert (note in scope.note) if note else scope.note == ""


# --- the rule object ---


def test_manifest_has_the_full_selector_our_labels_and_our_taint_key() -> None:
    rule = RuleSpec(devicerules.rule_name("n1", dev(0)), "n1", dev(0), "xid-79", "NoSchedule")
    m = devicerules.manifest(rule)
    assert m["apiVersion"] == "resource.k8s.io/v1" and m["kind"] == "DeviceTaintRule"
    assert m["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    assert m["spec"]["taint"] == {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}
    assert m["metadata"]["labels"] == {MANAGED_BY_LABEL: "gpuwarden", DEVICE_RULE_NODE: "n1"}
    back = devicerules.owned_rule(m)
    assert back == OwnedRule(rule.name, "n1", DeviceRef(DRIVER, "n1", "gpu-0"), "xid-79", "NoSchedule")


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"metadata": {"name": "x", "labels": {DEVICE_RULE_NODE: "n1"}}}, id="not-managed-by-us"),
        pytest.param(
            {
                "spec": {
                    "taint": {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
                    "deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                }
            },
            id="a-driver-taint-key",
        ),
        pytest.param(
            {"spec": {"taint": {"key": QUARANTINE_TAINT}, "deviceSelector": {"driver": DRIVER}}},
            id="no-full-selector",
        ),
    ],
)
def test_rules_not_ours_are_never_read_as_ours(change: dict[str, Any]) -> None:
    rule = RuleSpec("r", "n1", dev(0), "xid-79", "NoSchedule")
    obj = {**devicerules.manifest(rule), **change}
    assert devicerules.owned_rule(obj) is None


def test_rule_names_are_deterministic_distinct_and_bounded() -> None:
    assert devicerules.rule_name("n1", dev(0)) == devicerules.rule_name("n1", dev(0))
    assert devicerules.rule_name("n1", dev(0)) != devicerules.rule_name("n1", dev(1))
    assert devicerules.rule_name("n1", dev(0)) != devicerules.rule_name("n2", dev(0))
    assert len(devicerules.rule_name("n" * 253, dev(0))) <= 253
    assert len(devicerules.node_label("n" * 100)) <= 63 and devicerules.node_label("n1") == "n1"


# --- decide: the quarantine on a DRA-backed node ---

XID_79_GPU0 = {0: {"xids": (79,)}}


@pytest.mark.parametrize(
    ("api", "devices", "taint_effect", "rules", "note"),
    [
        pytest.param("served", DEVICES, "PreferNoSchedule", 1, "DeviceTaintRule", id="served-device-rule"),
        pytest.param("not-served", DEVICES, "NoSchedule", 0, "not served", id="404-falls-back-to-node-taint"),
        pytest.param("unknown", DEVICES, "NoSchedule", 0, "could not be read", id="unknown-falls-back"),
        pytest.param("served", {}, "NoSchedule", 0, "not in the node's ResourceSlices", id="uuid-unmapped"),
    ],
)
def test_quarantine_on_a_dra_node(
    api: DeviceRulesApi, devices: dict[str, DeviceRef], taint_effect: str, rules: int, note: str
) -> None:
    plan = plan_quarantine(snap(dra_node(per_gpu=XID_79_GPU0, devices=devices), api=api), HealthPolicy(), NOW)
    (q,) = plan.actions_of("quarantine")
    assert q.add_taint == Taint(QUARANTINE_TAINT, "xid-79", taint_effect)
    assert q.record is not None and q.condition is not None and q.event is not None  # as for node taints
    assert len(q.rules) == rules and len(q.record.devices) == rules
    if rules:
        assert q.rules[0].device == dev(0) and q.rules[0].effect == "NoSchedule"
        assert q.rules[0].value == "xid-79"
    else:
        assert note in q.record.scope_note
    assert note in q.event.note
    assert plan.breaker.quarantined == 0 and plan.gpu_nodes == 1  # a DRA node counts as a GPU node


def test_device_plugin_node_is_unchanged() -> None:
    plan = plan_quarantine(snap(node("n1", per_gpu=XID_79_GPU0)), HealthPolicy(), NOW)
    (q,) = plan.actions_of("quarantine")
    assert q.add_taint is not None and q.add_taint.effect == "NoSchedule"
    assert q.rules == () and q.record is not None and q.record.devices == () and q.record.scope_note == ""


def test_device_taint_effect_is_configurable() -> None:
    policy = HealthPolicy(device_taint_effect="NoExecute")
    plan = plan_quarantine(snap(dra_node(per_gpu=XID_79_GPU0)), policy, NOW)
    (q,) = plan.actions_of("quarantine")
    assert [r.effect for r in q.rules] == ["NoExecute"]


def device_record(*indices: int, **kw: Any) -> QuarantineRecord:
    return replace(record(**kw), effect="PreferNoSchedule", devices=tuple(dev(i) for i in indices))


MARKER = Taint(QUARANTINE_TAINT, "xid-79", "PreferNoSchedule")


def test_new_evidence_on_another_gpu_adds_its_rule() -> None:
    n = dra_node(per_gpu={0: {"xids": (79,)}, 2: {"xids": (79,)}}, taints=(MARKER,), rec=device_record(0))
    plan = plan_quarantine(snap(n), HealthPolicy(), NOW)
    (u,) = plan.actions_of("update-record")
    assert u.record is not None and u.record.devices == (dev(0), dev(2))
    assert sorted(r.device for r in u.rules) == [dev(0), dev(2)]
    assert u.add_taint is None


def test_evidence_no_rule_can_hold_widens_to_the_node_taint() -> None:
    devices = {k: v for k, v in DEVICES.items() if k != "GPU-n1-2"}
    n = dra_node(
        per_gpu={0: {"xids": (79,)}, 2: {"xids": (79,)}},
        taints=(MARKER,),
        rec=device_record(0),
        devices=devices,
    )
    plan = plan_quarantine(snap(n), HealthPolicy(), NOW)
    (u,) = plan.actions_of("update-record")
    assert u.reason == "scope-widened"
    assert u.add_taint == Taint(QUARANTINE_TAINT, "xid-79", "NoSchedule") and u.remove_taint == MARKER
    assert u.record is not None and u.record.devices == () and "GPU-n1-2" in u.record.scope_note
    assert u.drop_rules == (devicerules.rule_name("n1", dev(0)),)


@pytest.mark.parametrize(
    ("api", "widened"),
    [
        pytest.param("not-served", True, id="api-gone-node-taint-takes-over"),
        pytest.param("unknown", False, id="api-unknown-nothing-changes"),
        pytest.param("served", False, id="api-served-nothing-changes"),
    ],
)
def test_a_device_quarantine_when_the_rule_api_goes(api: DeviceRulesApi, widened: bool) -> None:
    n = dra_node(per_gpu={0: {"xids": (79,)}}, taints=(MARKER,), rec=device_record(0))
    plan = plan_quarantine(snap(n, api=api), HealthPolicy(), NOW)
    widen = [a for a in plan.actions if a.reason == "scope-widened"]
    assert bool(widen) == widened
    if widened:
        assert widen[0].add_taint == Taint(QUARANTINE_TAINT, "xid-79", "NoSchedule")
        assert widen[0].record is not None and "not served" in widen[0].record.scope_note


def test_release_drops_the_rules() -> None:
    rec = device_record(0, at=NOW - 7200, healthy_since=NOW - 3600)
    n = dra_node(taints=(MARKER,), rec=rec, boot_id="boot-2")  # XID 79 recovers with a reboot
    plan = plan_quarantine(snap(n), HealthPolicy(), NOW)
    (r,) = plan.actions_of("release")
    assert r.remove_taint == MARKER and r.drop_rules == (devicerules.rule_name("n1", dev(0)),)


# --- plan_rule_sync ---


def owned(i: int, effect: str = "NoSchedule", value: str = "xid-79", node_name: str = "n1") -> OwnedRule:
    d = dev(i, node_name)
    return OwnedRule(
        devicerules.rule_name(node_name, d), node_name, DeviceRef(d.driver, d.pool, d.device), value, effect
    )


def spec(i: int, effect: str = "NoSchedule", value: str = "xid-79") -> RuleSpec:
    return RuleSpec(devicerules.rule_name("n1", dev(i)), "n1", dev(i), value, effect)


QUARANTINED = dra_node(taints=(MARKER,), rec=device_record(0))
FREE = dra_node()
WOULD = Action("quarantine", "n1", "xid-79", "x", add_taint=MARKER, record=device_record(0), rules=(spec(0),))


@pytest.mark.parametrize(
    ("nodes", "actions", "existing", "dry_run", "want"),
    [
        pytest.param([QUARANTINED], [], [owned(0)], False, RuleSync(), id="in-step-nothing"),
        pytest.param([QUARANTINED], [], [], False, RuleSync(create=(spec(0),)), id="deleted-rule-recreated"),
        pytest.param(
            [QUARANTINED],
            [],
            [owned(0, "None")],
            False,
            RuleSync(update=(spec(0),)),
            id="effect-brought-in-step",
        ),
        pytest.param([FREE], [], [owned(0)], False, RuleSync(delete=(owned(0).name,)), id="released-node-gc"),
        pytest.param([], [], [owned(0)], False, RuleSync(delete=(owned(0).name,)), id="node-gone-gc"),
        pytest.param([FREE], [WOULD], [], False, RuleSync(), id="action-writes-its-own-rules"),
        pytest.param([FREE], [WOULD], [], True, RuleSync(create=(spec(0, "None"),)), id="dry-run-none-rule"),
        pytest.param(
            [FREE], [], [owned(0, "None")], True, RuleSync(delete=(owned(0).name,)), id="dry-run-preview-gone"
        ),
        pytest.param([FREE], [], [owned(0)], True, RuleSync(), id="dry-run-never-touches-real-rules"),
        pytest.param([QUARANTINED], [], [owned(0, "None")], True, RuleSync(), id="dry-run-keeps-old-effect"),
        pytest.param(
            [dra_node(taints=(MARKER,), annotations={"gpuwarden.io/quarantine": "{"})],
            [],
            [owned(0)],
            False,
            RuleSync(),
            id="unreadable-record-kept",
        ),
        pytest.param(
            [replace(QUARANTINED, labels={"gpuwarden.io/exclude": "true"})],
            [],
            [owned(0)],
            False,
            RuleSync(),
            id="excluded-node-kept",
        ),
    ],
)
def test_plan_rule_sync(
    nodes: list[NodeState], actions: list[Action], existing: list[OwnedRule], dry_run: bool, want: RuleSync
) -> None:
    got = devicerules.plan_rule_sync(nodes, actions, existing, effect="NoSchedule", dry_run=dry_run)
    assert got == want


def test_plan_carries_the_sync_only_when_the_api_is_served() -> None:
    assert plan_quarantine(snap(QUARANTINED, owned=()), HealthPolicy(), NOW).rule_sync == RuleSync(
        create=(spec(0),)
    )
    assert not plan_quarantine(snap(QUARANTINED, api="unknown"), HealthPolicy(), NOW).rule_sync
    served = plan_quarantine(snap(QUARANTINED, owned=()), HealthPolicy(), NOW)
    assert "1 to create" in served.render_table()
    assert served.to_dict()["device_rules"]["create"] == [f"{spec(0).name}=xid-79:NoSchedule"]
