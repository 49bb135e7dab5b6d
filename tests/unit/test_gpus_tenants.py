"""Tables for tenants (controller/gpus/tenants.py): tenants from labels, globs and the namespace itself;
shares from config and ResourceQuotas; the over-share arithmetic; the three rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from controller.gpus.tenants import (
    Refusal,
    Rule,
    Tenancy,
    TenantPolicy,
    Victim,
    policy_from_config,
    refuse,
    taken_by,
    tenancy_from,
    tenant_of,
)
from gpuwarden.config.preemption import PreemptionConfig

RESOURCE = "nvidia.com/gpu"
GROUPS = (("ml", ("ml-*", "research"), 8), ("web", ("web-*",), None))


def ns(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def quota(namespace: str, gpus: Any, name: str = "gpus", key: str = f"requests.{RESOURCE}") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"hard": {key: gpus}}}


# --- tenant of a namespace ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "labels", "expected"),
    [
        pytest.param("team-a", {"gpuwarden.io/tenant": "alpha"}, "alpha", id="label"),
        pytest.param("ml-train", {"gpuwarden.io/tenant": "alpha"}, "alpha", id="label-wins-over-glob"),
        pytest.param("ml-train", {}, "ml", id="glob"),
        pytest.param("research", {}, "ml", id="exact-name-glob"),
        pytest.param("web-1", {}, "web", id="second-tenant-glob"),
        pytest.param("batch", {}, "batch", id="unlabelled-unmatched-is-its-own-tenant"),
        pytest.param("batch", {"gpuwarden.io/tenant": ""}, "batch", id="empty-label-ignored"),
        pytest.param("mlx", {}, "mlx", id="glob-is-not-a-prefix"),
    ],
)
def test_tenant_of(namespace: str, labels: dict[str, str], expected: str) -> None:
    assert tenant_of(namespace, labels, TenantPolicy(groups=GROUPS)) == expected


def test_first_matching_glob_wins() -> None:
    policy = TenantPolicy(groups=(("first", ("a-*",), None), ("second", ("a-b*",), None)))
    assert tenant_of("a-b1", {}, policy) == "first"


def test_custom_label() -> None:
    policy = TenantPolicy(label="example.com/team")
    assert tenant_of("x", {"example.com/team": "t", "gpuwarden.io/tenant": "u"}, policy) == "t"


# --- shares and holdings ----------------------------------------------------------------------------------


@dataclass
class ShareRow:
    id: str
    namespaces: list[dict[str, Any]]
    quotas: list[dict[str, Any]] = field(default_factory=list)
    held: list[tuple[str, int]] = field(default_factory=list)
    share: dict[str, int] = field(default_factory=dict)
    holding: dict[str, int] = field(default_factory=dict)


SHARES = [
    ShareRow("config-share", [ns("ml-a")], share={"ml": 8}),
    ShareRow(
        "config-share-wins-over-quota",
        [ns("ml-a")],
        [quota("ml-a", "2")],
        share={"ml": 8},
    ),
    ShareRow(
        "quotas-summed-over-the-tenants-namespaces",
        [ns("web-1"), ns("web-2")],
        [quota("web-1", "4"), quota("web-2", 2), quota("web-2", "1", name="more")],
        share={"ml": 8, "web": 7},
    ),
    ShareRow(
        "labelled-namespaces-pool-their-quotas",
        [ns("a1", **{"gpuwarden.io/tenant": "a"}), ns("a2", **{"gpuwarden.io/tenant": "a"})],
        [quota("a1", "2"), quota("a2", "3")],
        share={"ml": 8, "a": 5},
    ),
    ShareRow(
        "quota-other-resource-or-limits-ignored",
        [ns("b")],
        [quota("b", "4", key="requests.cpu"), quota("b", "4", name="l", key=f"limits.{RESOURCE}")],
        share={"ml": 8},
    ),
    ShareRow("milli-quantity-rounded-down", [ns("b")], [quota("b", "2500m")], share={"ml": 8, "b": 2}),
    ShareRow("unreadable-quantity-is-zero", [ns("b")], [quota("b", "lots")], share={"ml": 8, "b": 0}),
    ShareRow("quota-of-unknown-namespace-ignored", [ns("b")], [quota("gone", "4")], share={"ml": 8}),
    ShareRow(
        "held-per-tenant",
        [ns("ml-a"), ns("research"), ns("b")],
        held=[("ml-a", 4), ("research", 2), ("b", 1), ("b", 0)],
        share={"ml": 8},
        holding={"ml": 6, "b": 1},
    ),
    ShareRow(
        "held-in-unknown-namespace-counts-for-no-tenant",
        [ns("b")],
        held=[("gone", 4)],
        share={"ml": 8},
    ),
]


@pytest.mark.parametrize("row", SHARES, ids=lambda r: r.id)
def test_tenancy_from(row: ShareRow) -> None:
    policy = TenantPolicy(Rule.OVER_SHARE, groups=GROUPS)
    tenancy = tenancy_from(row.namespaces, row.quotas, row.held, policy, RESOURCE)
    assert dict(tenancy.share) == row.share
    assert dict(tenancy.held) == row.holding


# --- the rule ---------------------------------------------------------------------------------------------

# tenant a: namespaces a1, a2 (share 4); tenant b: namespace b (share 4); c: share 0; "gone" not known
TENANTS = {"a1": "a", "a2": "a", "b": "b", "c": "c"}
SHARE = {"a": 4, "b": 4, "c": 0}


def tenancy(rule: Rule, **held: int) -> Tenancy:
    return Tenancy(rule, TENANTS, SHARE, held)


@dataclass
class RuleRow:
    id: str
    rule: Rule
    victims: list[Victim]
    held: dict[str, int] = field(default_factory=dict)
    preemptor: str = "a1"
    taken: dict[str, int] = field(default_factory=dict)
    refused: str | None = None  # the refused victim's pod key; None = allowed
    reason: str = ""  # substring of the refusal


V_B1 = Victim("b/one", 1)
V_B2 = Victim("b/two", 2)
V_B4 = Victim("b/four", 4)

RULES = [
    # any: today's behaviour
    RuleRow("any-other-tenant-below-share", Rule.ANY, [V_B4], {"b": 4}),
    RuleRow("any-unknown-tenant", Rule.ANY, [Victim("gone/x", 4)]),
    # within-tenant
    RuleRow("within-same-namespace", Rule.WITHIN_TENANT, [Victim("a1/x", 4)]),
    RuleRow("within-same-tenant-other-namespace", Rule.WITHIN_TENANT, [Victim("a2/x", 4)]),
    RuleRow(
        "within-other-tenant-refused-even-over-share",
        Rule.WITHIN_TENANT,
        [Victim("a2/x", 1), V_B1],
        {"b": 12},
        refused="b/one",
        reason="tenant b, not a (rule within-tenant)",
    ),
    RuleRow(
        "within-unknown-victim-tenant-refused",
        Rule.WITHIN_TENANT,
        [Victim("gone/x", 1)],
        refused="gone/x",
        reason="tenant of namespace gone unknown",
    ),
    RuleRow(
        "within-unknown-preemptor-tenant-own-namespace-allowed",
        Rule.WITHIN_TENANT,
        [Victim("gone/x", 1)],
        preemptor="gone",
    ),
    RuleRow(
        "within-unknown-preemptor-tenant-other-namespace-refused",
        Rule.WITHIN_TENANT,
        [Victim("a1/x", 1)],
        preemptor="gone",
        refused="a1/x",
        reason="not ? (rule within-tenant)",
    ),
    # over-share arithmetic
    RuleRow("over-share-one-gpu-over-takes-one", Rule.OVER_SHARE, [V_B1], {"b": 5}),
    RuleRow(
        "over-share-exactly-at-share-refused",
        Rule.OVER_SHARE,
        [V_B1],
        {"b": 4},
        refused="b/one",
        reason="holds 4 GPUs of a 4-GPU share",
    ),
    RuleRow("over-share-below-share-refused", Rule.OVER_SHARE, [V_B1], {"b": 2}, refused="b/one"),
    RuleRow(
        "over-share-multi-gpu-victim-overshooting-refused",
        Rule.OVER_SHARE,
        [V_B4],
        {"b": 5},
        refused="b/four",
        reason="taking its 4 would leave it below its share (rule over-share, 1 GPUs preemptable)",
    ),
    RuleRow("over-share-multi-gpu-victim-exactly-back-to-share", Rule.OVER_SHARE, [V_B4], {"b": 8}),
    RuleRow(
        "over-share-victims-together-beyond-excess-second-refused",
        Rule.OVER_SHARE,
        [V_B2, V_B2],
        {"b": 7},
        refused="b/two",
        reason="1 GPUs preemptable",
    ),
    RuleRow("over-share-victims-together-within-excess", Rule.OVER_SHARE, [V_B1, V_B2], {"b": 7}),
    RuleRow(
        "over-share-already-taken-this-pass",
        Rule.OVER_SHARE,
        [V_B2],
        {"b": 7},
        taken={"b": 2},
        refused="b/two",
    ),
    RuleRow("over-share-zero-share-tenant-fully-preemptable", Rule.OVER_SHARE, [Victim("c/x", 3)], {"c": 3}),
    RuleRow(
        "over-share-zero-gpu-victim-of-tenant-at-share-refused",
        Rule.OVER_SHARE,
        [Victim("b/cpu", 0)],
        {"b": 4},
        refused="b/cpu",
    ),
    RuleRow(
        "over-share-zero-gpu-victim-of-tenant-over-share", Rule.OVER_SHARE, [Victim("b/cpu", 0)], {"b": 5}
    ),
    RuleRow("over-share-own-tenant-below-share-allowed", Rule.OVER_SHARE, [Victim("a2/x", 4)], {"a": 1}),
    RuleRow(
        "over-share-unknown-victim-tenant-refused",
        Rule.OVER_SHARE,
        [Victim("gone/x", 1)],
        refused="gone/x",
        reason="unknown",
    ),
    RuleRow(
        "over-share-first-refused-reported-in-order",
        Rule.OVER_SHARE,
        [Victim("a2/x", 1), Victim("c/x", 1), V_B1],
        {"c": 1, "b": 4},
        refused="b/one",
    ),
]


@pytest.mark.parametrize("row", RULES, ids=lambda r: r.id)
def test_refuse(row: RuleRow) -> None:
    got = refuse(row.preemptor, row.victims, tenancy(row.rule, **row.held), row.taken)
    if row.refused is None:
        assert got is None
    else:
        assert isinstance(got, Refusal)
        assert got.victim == row.refused
        assert row.reason in got.reason


@pytest.mark.parametrize(
    ("rule", "held", "expected"),
    [
        pytest.param(Rule.ANY, 3, 3, id="any-everything-held"),
        pytest.param(Rule.WITHIN_TENANT, 9, 0, id="within-nothing"),
        pytest.param(Rule.OVER_SHARE, 6, 2, id="over-share-the-excess"),
        pytest.param(Rule.OVER_SHARE, 4, 0, id="over-share-at-share"),
        pytest.param(Rule.OVER_SHARE, 1, 0, id="over-share-below-share-not-negative"),
    ],
)
def test_preemptable(rule: Rule, held: int, expected: int) -> None:
    assert tenancy(rule, b=held).preemptable("b") == expected


def test_taken_by_sums_per_tenant_and_skips_unknown() -> None:
    victims = [V_B1, V_B2, Victim("a1/x", 4), Victim("a2/y", 1), Victim("gone/z", 8)]
    assert taken_by(victims, tenancy(Rule.OVER_SHARE)) == {"b": 3, "a": 5}


# --- config -------------------------------------------------------------------------------------------------


def test_config_default_is_any_and_changes_nothing() -> None:
    policy = policy_from_config(PreemptionConfig().tenants)
    assert policy.rule is Rule.ANY
    assert policy.label == "gpuwarden.io/tenant"
    assert refuse("a", [Victim("b/x", 8)], Tenancy(policy.rule)) is None


def test_config_to_policy() -> None:
    cfg = PreemptionConfig.model_validate(
        {
            "tenants": {
                "rule": "over-share",
                "tenants": [{"name": "ml", "namespaces": ["ml-*"], "guaranteed_gpus": 8}, {"name": "web"}],
            }
        }
    )
    policy = policy_from_config(cfg.tenants)
    assert policy.rule is Rule.OVER_SHARE
    assert policy.groups == (("ml", ("ml-*",), 8), ("web", (), None))


@pytest.mark.parametrize(
    ("tenants", "field_"),
    [
        pytest.param({"rule": "nobody"}, "tenants.rule", id="unknown-rule"),
        pytest.param({"rules": "any"}, "tenants.rules", id="unknown-key"),
        pytest.param(
            {"tenants": [{"name": "a", "share": 2}]}, "tenants.tenants.0.share", id="unknown-tenant-key"
        ),
        pytest.param({"tenants": [{"name": "a", "guaranteed_gpus": -1}]}, "guaranteed_gpus", id="negative"),
        pytest.param({"tenants": [{"name": "a", "guaranteed_gpus": True}]}, "guaranteed_gpus", id="bool"),
        pytest.param({"tenants": [{"name": "Not A Name"}]}, "tenants.tenants.0.name", id="bad-name"),
        pytest.param({"tenants": [{"name": "a"}, {"name": "a"}]}, "listed twice", id="duplicate-name"),
    ],
)
def test_config_rejects(tenants: dict[str, Any], field_: str) -> None:
    with pytest.raises(ValidationError) as err:
        PreemptionConfig.model_validate({"tenants": tenants})
    assert field_ in str(err.value)
