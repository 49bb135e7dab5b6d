"""The pre-encoded answers (answers.py, the extender's one route for filter and prioritize) against fit.py's
pure decisions as an oracle: `filter_nodes` + `explain_room` encoded by the pydantic model, and `score_nodes`
encoded by `encode_host_priorities` - byte for byte, on fleets with every kind of node, and again after the
nodes change. (The service no longer has a second route to hold the answers to; fit.py keeps
`filter_nodes` for `never_fits` and the capabilities' tests.)"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.extender.answers import FAILED, PASSED, AnswerCache, keepable
from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService
from controller.extenderv1 import ExtenderArgs, ExtenderFilterResult, encode_host_priorities
from controller.gpus.fit import Settings, filter_nodes, score_nodes
from controller.gpus.model import ClusterModel
from controller.gpus.objects import pod_info
from controller.gpus.victims import explain_room
from tests.unit.extender_support import RESOURCE, pod, quarantine_record
from tests.unit.extender_support import model as support_model
from tests.unit.extender_support import node as support_node

NOW = 1_700_000_000.0


def fleet(rng: random.Random, size: int = 60) -> tuple[ClusterModel, list[str]]:
    """Nodes of every kind the answers distinguish: empty, partly and fully used, fragmented, quarantined,
    count-only and DRA-backed ones, nodes with claims (fresh and expired), nominations and preemption
    victims, with low- and high-priority holders."""
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i in range(size):
        name = f"n{i:03d}"
        kind = i % 10
        if kind == 1:
            nodes.append(support_node(name, quarantine=quarantine_record("0", "1")))
        elif kind == 2:
            nodes.append(support_node(name, topo=None))
        elif kind == 3:
            obj = support_node(name)
            del obj["status"]["allocatable"][RESOURCE]
            nodes.append(obj)  # no device plugin: DRA-backed when a DeviceClass serves the resource
        else:
            nodes.append(support_node(name))
        free = list(range(8))
        rng.shuffle(free)
        for j in range(rng.randint(0, 4)):
            k = min(rng.choice((1, 1, 2, 3)), len(free))
            ids, free = free[:k], free[k:]
            if not ids:
                break
            pods.append(
                pod(
                    f"h{i}-{j}",
                    k,
                    node=name,
                    ids=",".join(map(str, sorted(ids))) if kind != 4 else None,
                    priority=rng.choice((0, 100)),
                    disrupted="PreemptionByScheduler" if kind == 5 and j == 0 else "",
                )
            )
        if kind == 6 and free:
            pods.append(pod(f"c{i}", 1, ids=str(free[0]), claim=(name, NOW - rng.choice((1.0, 3600.0)))))
        if kind == 7:
            pods.append(pod(f"nom{i}", 2, nominated=name, priority=50))
    m = support_model(nodes, pods)
    m.set_device_classes(
        [{"metadata": {"name": "gpu.example.com"}, "spec": {"extendedResourceName": RESOURCE}}]
    )
    return m, [*m.node_names(), "unknown-node"]


def general(service: ExtenderService, obj: dict[str, Any], names: list[str]) -> tuple[bytes, bytes]:
    """The filter and prioritize answers as fit.py's pure decisions give them, encoded by the wire models."""
    p, settings = pod_info(obj, RESOURCE), service.current_settings()
    views = service._views(names)
    result = explain_room(p, filter_nodes(p, views, settings, NOW), dict(views), settings, NOW)
    filtered = ExtenderFilterResult(
        node_names=list(result.passed),
        failed_nodes=result.failed,
        failed_and_unresolvable_nodes=result.unresolvable,
    ).to_json()
    passed = [(n, v) for n, v in views if n in set(result.passed)]
    return filtered, encode_host_priorities(score_nodes(p, passed, settings, NOW))


async def answered(service: ExtenderService, obj: dict[str, Any], names: list[str]) -> tuple[bytes, bytes]:
    filtered = (await service.filter(ExtenderArgs(pod=obj, node_names=names))).to_json()
    passed = json.loads(filtered)["NodeNames"]
    scored = (await service.prioritize(ExtenderArgs(pod=obj, node_names=passed))).to_json()
    return filtered, scored


SHAPES = [
    pytest.param(1, None, 0, id="1-gpu"),
    pytest.param(2, None, 0, id="2-gpus-single-numa"),
    pytest.param(4, None, 200, id="4-gpus-high-priority"),
    pytest.param(8, None, 200, id="8-gpus-spans-numa-high-priority"),
    pytest.param(3, "prefer-numa", 0, id="3-gpus-prefer-numa"),
    pytest.param(2, "single-pcie", 0, id="2-gpus-single-pcie"),
    pytest.param(2, "bogus", 0, id="invalid-policy"),
    pytest.param(9, None, 0, id="more-than-any-node"),
]


@pytest.mark.parametrize(("gpus", "policy", "priority"), SHAPES)
async def test_answers_match_the_general_path_byte_for_byte_before_and_after_changes(
    gpus: int, policy: str | None, priority: int
) -> None:
    rng = random.Random(gpus * 31 + priority)
    m, names = fleet(rng)
    service = ExtenderService(
        m, Settings(fleet_max_numa_gpus=4), extender_metrics(CollectorRegistry()), clock=lambda: NOW,
        settle_seconds=0,
    )  # fmt: skip
    incoming = pod("incoming", gpus, policy=policy, priority=priority)
    for round_ in range(4):
        candidates = rng.sample(names, 40)
        assert await answered(service, incoming, candidates) == general(service, incoming, candidates)
        # the same request again (now from the cache), then one node changes under it
        assert await answered(service, incoming, candidates) == general(service, incoming, candidates)
        changed = rng.choice(candidates[:-1] if candidates[-1] == "unknown-node" else candidates)
        m.upsert_pod(pod(f"new{round_}", 1, node=changed, ids=str(rng.randrange(8))))


async def test_a_changed_node_is_answered_anew_not_from_the_cache() -> None:
    m = support_model([support_node("a"), support_node("b")], [])
    service = ExtenderService(m, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: NOW)
    incoming = pod("incoming", 8)
    first, _ = await answered(service, incoming, ["a", "b"])
    assert json.loads(first)["NodeNames"] == ["a", "b"]
    m.upsert_pod(pod("taker", 1, node="a", ids="0"))
    second, _ = await answered(service, incoming, ["a", "b"])
    assert json.loads(second)["NodeNames"] == ["b"]
    assert "a" in json.loads(second)["FailedNodes"]


async def test_new_settings_drop_every_kept_answer() -> None:
    m = support_model([support_node("a")], [pod("h", 2, node="a", ids="0,4")])
    service = ExtenderService(m, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: NOW)
    incoming = pod("incoming", 4)  # single-numa: no NUMA node has 4 free; with policy none it fits
    first, _ = await answered(service, incoming, ["a"])
    assert json.loads(first)["NodeNames"] == []
    service.settings = Settings(default_policy=Settings().default_policy.NONE)
    second, _ = await answered(service, incoming, ["a"])
    assert json.loads(second)["NodeNames"] == ["a"]


@pytest.mark.parametrize(
    ("pods", "kept"),
    [
        pytest.param([], True, id="plain-node-kept"),
        pytest.param([pod("h", 1, node="a", ids="0")], True, id="bound-holder-kept"),
        pytest.param([pod("c", 1, ids="0", claim=("a", NOW))], False, id="claim-clock-dependent"),
        pytest.param([pod("n", 1, nominated="a")], False, id="nomination-pod-dependent"),
        pytest.param(
            [pod("v", 1, node="a", ids="0", disrupted="PreemptionByScheduler")],
            False,
            id="victim-pod-dependent",
        ),
    ],
)
def test_only_answers_that_depend_on_the_view_alone_are_kept(pods: list[dict[str, Any]], kept: bool) -> None:
    m = support_model([support_node("a")], pods)
    assert keepable(m.view("a")) is kept
    cache = AnswerCache()
    cache.answers(pod_info(pod("incoming", 1), RESOURCE), ["a", "zz"], m.view, Settings(), NOW)
    assert len(cache) == (1 if kept else 0)  # an unknown node is never kept either


def test_hot_nodes_are_derived_from_their_overlaid_view_and_never_kept() -> None:
    empty = support_model([support_node("a"), support_node("b")], [])
    full = support_model([support_node("a")], [pod("h", 8, node="a", ids="0,1,2,3,4,5,6,7")])
    incoming, settings = pod_info(pod("incoming", 1), RESOURCE), Settings()
    cache = AnswerCache()
    names = ["a", "b", "a"]  # a name twice: every place of a hot node is derived

    def kinds(hot: set[str]) -> list[int]:
        def view(name: str) -> Any:
            return full.view(name) if name in hot else empty.view(name)

        return [a.kind for a in cache.answers(incoming, names, view, settings, NOW, hot)]

    assert kinds(set()) == [PASSED, PASSED, PASSED]  # now kept
    assert kinds({"a"}) == [FAILED, PASSED, FAILED]  # this replica's claims fill "a": not the kept answer
    assert kinds({"nominated-elsewhere"}) == [PASSED, PASSED, PASSED]  # the overlaid answer was not kept
