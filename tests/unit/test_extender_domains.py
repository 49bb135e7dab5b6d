"""Placement inside an NVLink domain: a pod of a multi-pod job is scored toward the domain its siblings run in
and never placed into one health published degraded or failed (filter rejects its members); other pods are
filtered and scored as before. The rules as tables, the GPU model's job index, and the extender's filter
and prioritize answers end to end."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService
from controller.extenderv1 import ExtenderArgs
from controller.gpus.domains import (
    DomainPlacement,
    domain_refusal,
    job_group,
    placement_score,
    preferred_domains,
)
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from gpuwarden.config.domains import CLIQUE_LABEL
from gpuwarden.wellknown import NVLINK_DOMAIN_HEALTH
from tests.unit.extender_support import RESOURCE, node, pod

NOW = 1_700_000_000.0
A, B, C = "uuid-a.1", "uuid-b.1", "uuid-c.1"
JOB = "batch.kubernetes.io/job-name"
PLACEMENT = DomainPlacement(CLIQUE_LABEL, (JOB, "scheduling.x-k8s.io/pod-group"), 5)


@pytest.mark.parametrize(
    ("score", "domain", "health", "preferred", "weight", "expected"),
    [
        (8, A, None, frozenset(), 5, 8),  # no sibling placed: the topology score
        (8, A, "degraded", frozenset(), 5, 0),  # degraded domain: never preferred
        (10, A, "failed", frozenset({A}), 5, 0),  # even the siblings' own, once failed
        (8, A, None, frozenset({A}), 5, 9),  # siblings' domain: 5 + 8 * 5 // 10
        (8, B, None, frozenset({A}), 5, 4),  # another healthy domain: the topology share only
        (10, None, None, frozenset({A}), 5, 5),  # a node in no domain is not the siblings' domain
        (0, A, None, frozenset({A}), 10, 10),  # weight 10: the domain alone decides
        (7, B, None, frozenset({A}), 0, 7),  # weight 0: no preference
    ],
    ids=["no-siblings", "degraded", "failed-own", "own-domain", "other-domain", "no-domain", "w10", "w0"],
)
def test_placement_score(
    score: int, domain: str | None, health: str | None, preferred: frozenset[str], weight: int, expected: int
) -> None:
    assert placement_score(score, domain, health, preferred, weight) == expected


@pytest.mark.parametrize(
    ("domain", "health", "refused"),
    [
        (A, None, False),  # healthy (nothing published): placed as any node
        (A, "degraded", True),
        (A, "failed", True),
        (None, None, False),  # in no domain
        (A, "unknown", False),  # not a value health publishes as unhealthy: not refused
        (None, "degraded", True),  # the label without a clique label still refuses (health published it)
    ],
    ids=["healthy", "degraded", "failed", "no-domain", "other-value", "label-only"],
)
def test_domain_refusal(domain: str | None, health: str | None, refused: bool) -> None:
    reason = domain_refusal(domain, health, ("ml", JOB, "train"))
    assert (reason is not None) == refused
    if reason is not None:
        assert f"published {health}" in reason and f"{JOB}=train" in reason and NVLINK_DOMAIN_HEALTH in reason
        assert (domain or "its NVLink domain") in reason


def test_job_group_and_preferred_domains() -> None:
    keys = (JOB, "scheduling.x-k8s.io/pod-group")
    assert job_group("ml", {"scheduling.x-k8s.io/pod-group": "pg", JOB: "j"}, keys) == ("ml", JOB, "j")
    assert job_group("ml", {JOB: ""}, keys) is None and job_group("ml", {"app": "x"}, keys) is None
    assert preferred_domains(Counter({A: 3, B: 1})) == {A}
    assert preferred_domains(Counter({A: 2, B: 2})) == {A, B} and preferred_domains(Counter()) == frozenset()


def tray(name: str, clique: str, health: str | None = None) -> dict[str, Any]:
    obj = node(name, 4)
    obj["metadata"]["labels"] = {CLIQUE_LABEL: clique} | ({NVLINK_DOMAIN_HEALTH: health} if health else {})
    return obj


def worker(name: str, job: str | None, node_name: str = "", namespace: str = "ml") -> dict[str, Any]:
    obj = pod(name, 4, node=node_name, namespace=namespace, ids="0,1,2,3" if node_name else None)
    if job:
        obj["metadata"]["labels"][JOB] = job
    return obj


def fleet(*, b_health: str | None = None, placed: tuple[tuple[str, str], ...] = ()) -> ClusterModel:
    m = ClusterModel(RESOURCE, placement=PLACEMENT)
    for i in range(3):
        m.upsert_node(tray(f"a{i}", A))
        m.upsert_node(tray(f"b{i}", B, b_health))
    m.upsert_node(node("plain", 4))
    for name, where in placed:
        m.upsert_pod(worker(name, "train", where))
    m.nodes_synced = m.pods_synced = True
    return m


def test_the_model_indexes_bound_siblings_by_job_and_follows_them() -> None:
    m = fleet(placed=(("w0", "a0"), ("w1", "a1"), ("w2", "b0")))
    assert m.sibling_domains(("ml", JOB, "train")) == Counter({A: 2, B: 1})
    assert m.sibling_domains(("other", JOB, "train")) == Counter()  # namespaces keep jobs apart
    m.delete_pod("ml/w0")
    m.upsert_pod(worker("w1", "train", "a1") | {"status": {"phase": "Succeeded"}})
    assert m.sibling_domains(("ml", JOB, "train")) == Counter({B: 1})
    m.upsert_node(tray("b0", B, "degraded"))
    assert m.node_domain("b0") == (B, "degraded") and m.node_domain("plain") == (None, None)
    m.delete_node("b0")
    assert m.sibling_domains(("ml", JOB, "train")) == Counter()


async def scores(m: ClusterModel, obj: dict[str, Any]) -> dict[str, int]:
    service = ExtenderService(m, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: NOW)
    names = m.node_names()
    body = (await service.prioritize(ExtenderArgs(pod=obj, node_names=names))).to_json()
    return {e["Host"]: e["Score"] for e in json.loads(body)}


async def test_prioritize_steers_a_job_pod_toward_its_siblings_domain() -> None:
    m = fleet(placed=(("w0", "a0"),))
    got = await scores(m, worker("w1", "train"))
    assert min(got[f"a{i}"] for i in (1, 2)) > max(got[f"b{i}"] for i in range(3))
    assert got["a1"] > got["plain"]


async def test_prioritize_never_prefers_a_degraded_domain_for_a_job_pod() -> None:
    m = fleet(b_health="degraded")
    got = await scores(m, worker("w0", "train"))
    assert {got[f"b{i}"] for i in range(3)} == {0} and min(got[f"a{i}"] for i in range(3)) > 0


async def test_single_pod_work_scores_as_before_on_a_degraded_domain() -> None:
    with_rule = await scores(fleet(b_health="degraded"), worker("solo", None))
    plain = ClusterModel(RESOURCE)  # no placement at all
    for obj in [*(tray(f"a{i}", A) for i in range(3)), *(tray(f"b{i}", B, "degraded") for i in range(3))]:
        plain.upsert_node(obj)
    plain.upsert_node(node("plain", 4))
    plain.nodes_synced = plain.pods_synced = True
    assert with_rule == await scores(plain, worker("solo", None))
    assert with_rule["b0"] > 0


async def filtered(m: ClusterModel, obj: dict[str, Any]) -> dict[str, Any]:
    service = ExtenderService(m, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: NOW)
    body = (await service.filter(ExtenderArgs(pod=obj, node_names=m.node_names()))).to_json()
    result: dict[str, Any] = json.loads(body)
    return result


@pytest.mark.parametrize("health", ["degraded", "failed"])
async def test_filter_rejects_a_degraded_domains_members_for_a_job_pod(health: str) -> None:
    got = await filtered(fleet(b_health=health), worker("w0", "train"))
    assert sorted(got["NodeNames"]) == ["a0", "a1", "a2", "plain"]
    assert got["FailedNodes"] == {}
    refused = got["FailedAndUnresolvableNodes"]
    assert sorted(refused) == ["b0", "b1", "b2"]
    assert refused["b1"] == domain_refusal(B, health, ("ml", JOB, "train"))


async def test_filter_passes_a_degraded_domains_members_for_single_pod_work() -> None:
    got = await filtered(fleet(b_health="degraded"), worker("solo", None))
    assert sorted(got["NodeNames"]) == ["a0", "a1", "a2", "b0", "b1", "b2", "plain"]
    assert got["FailedAndUnresolvableNodes"] == {} and got["FailedNodes"] == {}


async def test_filter_refusal_replaces_a_full_members_own_failure() -> None:
    """A degraded member that is also full would fail resolvably (preemption may help); for a job pod it is
    unresolvable with the domain's reason: preemption cannot make the domain healthy."""
    m = fleet(b_health="degraded", placed=(("w9", "b0"),))
    solo = await filtered(m, worker("solo", None))
    assert "b0" in solo["FailedNodes"]  # full: preemption might help a single-node pod
    got = await filtered(m, worker("w0", "train"))
    assert "b0" not in got["FailedNodes"]
    assert got["FailedAndUnresolvableNodes"]["b0"] == domain_refusal(B, "degraded", ("ml", JOB, "train"))


async def test_filter_and_cache_agree_after_a_domain_recovers() -> None:
    """The refusal is applied per request on top of the cached per-node answers: once the label goes, the
    same service passes the members again (nothing stale kept)."""
    m = fleet(b_health="degraded")
    service = ExtenderService(m, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: NOW)

    async def names() -> list[str]:
        args = ExtenderArgs(pod=worker("w0", "train"), node_names=m.node_names())
        return sorted(json.loads((await service.filter(args)).to_json())["NodeNames"])

    assert "b0" not in await names()
    for i in range(3):
        m.upsert_node(tray(f"b{i}", B))
    assert await names() == ["a0", "a1", "a2", "b0", "b1", "b2", "plain"]
