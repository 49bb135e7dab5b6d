"""Device-scoped quarantine on DRA-backed nodes: which devices, which DeviceTaintRules, keeping them in step.

Why it exists: on a node whose GPUs DRA serves (`controller.gpus.dra`), a node taint would take every GPU
of the node out of service for one faulty device, and it does not stop a claim from getting the faulty one
anyway on a node it may still schedule to. Kubernetes 1.37 has the right tool: a `resource.k8s.io/v1`
DeviceTaintRule, one taint on one device (`../shared/reference/dra.md` §4). Here, pure:

- `scope_of`: a quarantine on a DRA-backed node is device-scoped when the API serves DeviceTaintRule v1 and
  every faulty GPU named by the evidence maps to a device of the node's ResourceSlices (attribute `uuid`);
  otherwise it is the node-level quarantine of a device-plugin node, with the reason said (unknown is never
  "fine": a rule API we cannot read, node-level evidence or an unmapped UUID all quarantine the whole node).
- `rule_name`, `manifest`: our rules are named after the node and the device (so a second create is a
  409, "already there"), labelled `app.kubernetes.io/managed-by: gpuwarden` and with the node, and always
  carry an explicit `deviceSelector` with driver, pool and device (a rule without one matched every device
  before v1.37.1).
- `plan_rule_sync`: what the API should hold after this pass's plan, against what it holds: rules of a
  quarantine someone deleted are recreated, rules whose quarantine is released or whose node is gone are
  removed, dry-run keeps `effect: None` rules (a preview with no effect) in step and touches nothing else.

A device-scoped quarantine still writes the node's record, condition, Events, breaker start and metrics
exactly as a node taint does, and our taint on the node as its marker, with effect `PreferNoSchedule`: the
node's other GPUs stay usable, every reader of the quarantine rule (drain, `gpuwarden plan`, the breaker's
count, an operator removing it by hand) finds the quarantine where it always was.

What it must not do: no I/O, no clock. Only our rules (by label) are ever planned; a driver's own device
taints (ResourceSlice `taints`, e.g. `gpu.nvidia.com/xid`) are not even read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.health import plan as p
from controller.health.snapshot import DeviceRulesApi, NodeState, OwnedRule
from gpuwarden.quarantine import DeviceRef, QuarantineRecord, decode
from gpuwarden.wellknown import DEVICE_RULE_NODE, MANAGED_BY, MANAGED_BY_LABEL
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY

API_VERSION = "resource.k8s.io/v1"
MARKER_EFFECT = "PreferNoSchedule"
"""Our node taint's effect while the quarantine is device-scoped: the marker, not the block."""
DRY_RUN_EFFECT = "None"
OWNED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{DEVICE_RULE_NODE}"
"""Label selector of our rules (the list that also tells whether the API serves them)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a quarantine lands: on `devices` (DeviceTaintRules), or the node when empty; `note` says why
    a DRA-backed node's quarantine is node-level (empty on a device-plugin node)."""

    devices: tuple[DeviceRef, ...] = ()
    note: str = ""


def scope_of(
    node_devices: Mapping[str, DeviceRef] | None,
    gpus: Iterable[str],
    api: DeviceRulesApi,
    why: str = "",
) -> Scope:
    """The scope of a quarantine whose evidence names `gpus` (one per finding, "" = node-level evidence)."""
    if node_devices is None:
        return Scope()
    if api == "not-served":
        return Scope(note=f"DeviceTaintRule {API_VERSION} not served ({why or '404'}): node-level quarantine")
    if api == "unknown":
        return Scope(note=f"DeviceTaintRules could not be read ({why or 'unknown'}): node-level quarantine")
    named = list(gpus)
    if not named or "" in named:
        return Scope(note="node-level evidence on a DRA-backed node: node-level quarantine")
    missing = sorted({g for g in named if g not in node_devices})
    if missing:
        return Scope(note=f"GPU {', '.join(missing)} not in the node's ResourceSlices: node-level quarantine")
    return Scope(devices=tuple(sorted({node_devices[g] for g in named})))


def rule_name(node: str, device: DeviceRef) -> str:
    """`gpuwarden-<node>-<10 hex of driver/pool/device>`: one name per (node, device), a DNS subdomain."""
    digest = hashlib.sha256("/".join(device.key).encode()).hexdigest()[:10]
    return f"gpuwarden-{node[:220]}-{digest}"


def node_label(node: str) -> str:
    """The node as a label value (63 characters at most: a longer name is shortened with its hash)."""
    if len(node) <= 63:
        return node
    return f"{node[:40]}-{hashlib.sha256(node.encode()).hexdigest()[:22]}"


def rules_for(node: str, record: QuarantineRecord, effect: str) -> tuple[p.RuleSpec, ...]:
    """The rules a device-scoped record asks for (none for a node-level one)."""
    return tuple(
        sorted(p.RuleSpec(rule_name(node, d), node, d, record.reason, effect) for d in record.devices)
    )


def manifest(rule: p.RuleSpec) -> dict[str, Any]:
    """The DeviceTaintRule object: explicit selector (driver, pool, device) always."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule.name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, DEVICE_RULE_NODE: node_label(rule.node)},
        },
        "spec": {
            "deviceSelector": {
                "driver": rule.device.driver,
                "pool": rule.device.pool,
                "device": rule.device.device,
            },
            "taint": {"key": TAINT_KEY, "value": rule.value, "effect": rule.effect},
        },
    }


def taint_patch(rule: p.RuleSpec) -> dict[str, Any]:
    """Merge patch bringing an existing rule's taint in step (the API bumps `timeAdded` on a new effect)."""
    return {"spec": {"taint": {"key": TAINT_KEY, "value": rule.value, "effect": rule.effect}}}


def owned_rule(obj: Mapping[str, Any]) -> OwnedRule | None:
    """One listed rule as ours, None when it is not (wrong label or no full selector: never touched)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = obj.get("spec") or {}
    sel = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or DEVICE_RULE_NODE not in labels:
        return None
    if taint.get("key") != TAINT_KEY or not (sel.get("driver") and sel.get("pool") and sel.get("device")):
        return None
    device = DeviceRef(str(sel["driver"]), str(sel["pool"]), str(sel["device"]))
    name = str(meta.get("name", ""))
    return OwnedRule(name, str(labels[DEVICE_RULE_NODE]), device, str(taint.get("value", "")),
                     str(taint.get("effect", "")))  # fmt: skip


def _after_plan(node: NodeState, actions: Iterable[p.Action]) -> QuarantineRecord | None:
    """The node's quarantine record once `actions` are applied, if it is then quarantined (our taint on)."""
    record, error = decode(node.annotations.get(RECORD_ANNOTATION))
    tainted = node.our_taint is not None
    for a in actions:
        if a.add_taint is not None:
            tainted = True
        elif a.remove_taint is not None:
            tainted = False
        if a.record is not None:
            record = a.record
        elif a.remove_record:
            record = None
    if error or not tainted or record is None or record.state != "quarantined":
        return None
    return record


def plan_rule_sync(
    nodes: Iterable[NodeState],
    actions: Iterable[p.Action],
    existing: Iterable[OwnedRule],
    *,
    effect: str,
    dry_run: bool,
) -> p.RuleSync:
    """The rule changes that bring the API in step with the quarantines after this pass's `actions`.

    Left alone: the rules of an excluded node, or of one whose record cannot be read (unknown, never
    released). Outside dry-run the rules an action creates or drops itself are not repeated here.
    Dry-run: the quarantines the plan would write get `effect: None` rules; only `None` rules are
    created, changed or removed (a real quarantine's rules from before dry-run stay as they are)."""
    actions = tuple(actions)
    by_node: dict[str, list[p.Action]] = {}
    for a in actions:
        by_node.setdefault(a.node, []).append(a)
    desired: dict[str, p.RuleSpec] = {}
    keep: set[str] = set()
    for node in nodes:
        if node.excluded or decode(node.annotations.get(RECORD_ANNOTATION))[1]:
            keep.add(node_label(node.name))
            continue
        acts = by_node.get(node.name, ())
        if not dry_run:
            after = _after_plan(node, acts)
            rules = rules_for(node.name, after, effect) if after is not None else ()
        elif (real := _after_plan(node, ())) is not None:
            rules = rules_for(node.name, real, effect)
        else:
            would = _after_plan(node, acts)
            rules = rules_for(node.name, would, DRY_RUN_EFFECT) if would is not None else ()
        desired.update((r.name, r) for r in rules)
    if not dry_run:  # the actions write their own rules, in order with their node writes and Events
        desired = {k: v for k, v in desired.items() if not any(k == r.name for a in actions for r in a.rules)}
        keep_names = {n for a in actions for n in a.drop_rules} | {r.name for a in actions for r in a.rules}
    else:
        keep_names = set()
    have = {r.name: r for r in existing if r.name not in keep_names}
    create, update, delete = [], [], []
    for name, want in sorted(desired.items()):
        got = have.get(name)
        if got is None:
            if not dry_run or want.effect == DRY_RUN_EFFECT:
                create.append(want)
        elif (got.device.key, got.value, got.effect) != (want.device.key, want.value, want.effect) and (
            not dry_run or (want.effect == DRY_RUN_EFFECT and got.effect == DRY_RUN_EFFECT)
        ):
            update.append(want)
    for name, got in sorted(have.items()):
        if name in desired or got.node in keep:
            continue
        if not dry_run or got.effect == DRY_RUN_EFFECT:
            delete.append(name)
    return p.RuleSync(tuple(create), tuple(update), tuple(delete))
