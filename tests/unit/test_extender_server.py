"""The extender's HTTP edge against golden payloads: every verb, both cache modes, the error contract."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controller.extender.bind import Binder
from controller.extender.metrics import extender_metrics, register_model_collectors
from controller.extender.server import ExtenderService, add_extender_routes
from controller.extenderv1 import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
)
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from controller.gpus.objects import PodInfo, pod_info
from tests.unit.extender_support import FakePodApi, pod
from tests.unit.extender_support import model as support_model
from tests.unit.extender_support import node as support_node

GOLDEN = Path(__file__).parent / "golden" / "extender"
NOW = 1_700_000_000.0


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes().strip()


def cluster_pods() -> list[dict[str, Any]]:
    train = json.loads(golden("pod_train-0.json"))
    return [
        pod("a", 2, node="gpu-node-1", ids="0,1"),
        pod("b", 3, node="gpu-node-1", ids="4,5,6"),
        train,
    ]


def build(*, synced: bool = True) -> tuple[ExtenderService, FakePodApi, CollectorRegistry]:
    registry = CollectorRegistry()
    model = ClusterModel("nvidia.com/gpu")
    for node in json.loads(golden("filter_args_nocache.json"))["Nodes"]["items"]:
        model.upsert_node(node)
    api = FakePodApi(cluster_pods())
    for obj in api.pods.values():
        model.upsert_pod(obj)
    api.on_write.append(model.upsert_pod)  # the watch, delivered at once
    model.nodes_synced = model.pods_synced = synced
    metrics = extender_metrics(registry)
    register_model_collectors(registry, model)
    binder = Binder(api, model, lambda: service.current_settings(), clock=lambda: NOW)
    service = ExtenderService(model, Settings(), metrics, binder=binder, clock=lambda: NOW)
    return service, api, registry


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    service, _, _ = build()
    app = web.Application()
    add_extender_routes(app, service, "/gpu-extender/")
    async with TestClient(TestServer(app)) as c:
        yield c


VERBS = [
    ("filter", "filter_args_cache.json", "filter_result_cache.json"),
    ("filter", "filter_args_nocache.json", "filter_result_nocache.json"),
    ("prioritize", "prioritize_args_cache.json", "prioritize_result.json"),
    ("prioritize", "prioritize_args_nocache.json", "prioritize_result.json"),
    ("preempt", "preempt_args_cache.json", "preempt_result.json"),
    ("preempt", "preempt_args_nocache.json", "preempt_result.json"),
    ("bind", "bind_args.json", "bind_result_ok.json"),
    ("bind", "bind_args_unfit.json", "bind_result_unfit.json"),
]


@pytest.mark.parametrize(("verb", "request_file", "response_file"), VERBS, ids=[v[1] for v in VERBS])
async def test_golden_exchange(
    client: TestClient[web.Request, web.Application], verb: str, request_file: str, response_file: str
) -> None:
    resp = await client.post(f"/gpu-extender/{verb}", data=golden(request_file))
    assert resp.status == 200
    assert resp.content_type == "application/json"
    assert await resp.read() == golden(response_file)


async def test_filter_before_sync_answers_with_error_field() -> None:
    service, _, registry = build(synced=False)
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/gpu-extender/filter", data=golden("filter_args_cache.json"))
        assert resp.status == 200 and await resp.read() == golden("filter_result_error.json")
        resp = await c.post("/gpu-extender/prioritize", data=golden("prioritize_args_cache.json"))
        assert resp.status == 503
        resp = await c.post("/gpu-extender/bind", data=golden("bind_args.json"))
        assert json.loads(await resp.read())["Error"].endswith("not synced yet")
    assert (
        registry.get_sample_value("gpuwarden_extender_requests_total", {"verb": "filter", "outcome": "error"})
        == 1
    )
    assert registry.get_sample_value("gpuwarden_extender_model_synced") == 0


_ARGS = "malformed ExtenderArgs: Pod: Value error, not a v1.Pod: "
_BAD_POD = b'{"Pod":{"metadata":"x","spec":["not","a","podspec"]},"NodeNames":["n"]}'


def _pod_with(**fields: object) -> bytes:
    return json.dumps(
        {"Pod": {"metadata": {"name": "p", "namespace": "ml"}, **fields}, "NodeNames": ["n"]}
    ).encode()


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        ("filter", b"{", "malformed ExtenderArgs: body: Invalid JSON"),
        ("prioritize", b'{"NodeNames":[]}', "malformed ExtenderArgs: Pod: Field required"),
        ("bind", b'{"PodName":"x"}', "malformed ExtenderBindingArgs: PodNamespace: Field required"),
        ("preempt", b"[]", "malformed ExtenderPreemptionArgs"),
    ]
    + [  # the same wrongly typed pod, one validation path for every verb that carries a pod
        (verb, _BAD_POD, "malformed ExtenderArgs: Pod: Value error, not a v1.Pod: metadata must be an object")
        for verb in ("filter", "prioritize")
    ]
    + [
        ("preempt", _BAD_POD, "malformed ExtenderPreemptionArgs: Pod: Value error, not a v1.Pod: metadata"),
        ("filter", _pod_with(spec={"containers": [{"resources": {"limits": ["x"]}}]}),
         f"{_ARGS}spec.containers[0].resources.limits must be an object"),
        ("prioritize", _pod_with(spec={"priority": "high"}),
         f"{_ARGS}spec.priority must be an integer, not str"),
        ("filter", _pod_with(metadata={"annotations": {"gpuwarden.io/gpu-ids": 3}}),
         f"{_ARGS}metadata.annotations['gpuwarden.io/gpu-ids'] must be a string"),
        ("preempt", b'{"Pod":{},"NodeNameToVictims":{"n":{"Pods":[{"status":[]}]}}}',
         "malformed ExtenderPreemptionArgs: NodeNameToVictims.n.Pods: Value error, not a v1.Pod: status"),
        ("bind", b'{"PodName":5,"PodNamespace":"a","PodUID":"u","Node":"n"}',
         "malformed ExtenderBindingArgs: PodName: Input should be a valid string"),
    ],
)  # fmt: skip
async def test_malformed_request_is_400_with_a_message(
    client: TestClient[web.Request, web.Application], verb: str, body: bytes, message: str
) -> None:
    resp = await client.post(f"/gpu-extender/{verb}", data=body)
    assert resp.status == 400
    assert (await resp.text()).startswith(message)


async def test_internal_failure_uses_error_field_for_filter_and_500_for_preempt() -> None:
    service, _, registry = build()

    async def broken(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        raise RuntimeError("boom")

    service.preempt_hook = broken
    service.model.view = None  # type: ignore[assignment,method-assign]
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/gpu-extender/filter", data=golden("filter_args_cache.json"))
        body = json.loads(await resp.read())
        assert resp.status == 200 and body["Error"].startswith("gpuwarden extender: internal error")
        assert "boom" not in body["Error"] and body["NodeNames"] is None
        resp = await c.post("/gpu-extender/preempt", data=golden("preempt_args_cache.json"))
        assert resp.status == 500 and "boom" not in await resp.text()
    assert (
        registry.get_sample_value(
            "gpuwarden_extender_requests_total", {"verb": "preempt", "outcome": "error"}
        )
        == 1
    )


async def test_bind_records_gpus_then_binds_and_counts_placement() -> None:
    service, api, registry = build()
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/gpu-extender/bind", data=golden("bind_args.json"))
        assert await resp.read() == golden("bind_result_ok.json")
        # the scheduler retries a bind that timed out on its side: same answer, nothing rewritten
        writes = len([x for x in api.calls if not x.startswith(("get", "list"))])
        resp = await c.post("/gpu-extender/bind", data=golden("bind_args.json"))
        assert await resp.read() == golden("bind_result_ok.json")
        assert len([x for x in api.calls if not x.startswith(("get", "list"))]) == writes
    stored = api.pods["ml/train-0"]
    assert stored["spec"]["nodeName"] == "gpu-node-2"
    assert stored["metadata"]["annotations"]["gpuwarden.io/gpu-ids"] == "0,1,2,3"
    assert stored["metadata"]["annotations"]["gpuwarden.io/numa-node"] == "0"
    # the pod is in the watch cache, unbound: no GET before the claim (bind.py), the retry then reads it live
    assert [c.split()[0] for c in api.calls[:4]] == ["patch", "list", "bind", "get"]
    assert registry.get_sample_value("gpuwarden_extender_placements_total", {"alignment": "numa"}) == 1
    count = registry.get_sample_value("gpuwarden_extender_request_duration_seconds_count", {"verb": "bind"})
    assert count == 2


async def test_filter_metrics_by_result() -> None:
    service, _, registry = build()
    app = web.Application()
    add_extender_routes(app, service, "")
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/filter", data=golden("filter_args_cache.json"))
        assert resp.status == 200
    for result in ("passed", "failed", "unresolvable"):
        assert registry.get_sample_value("gpuwarden_extender_filter_nodes_total", {"result": result}) == 1
    assert registry.get_sample_value("gpuwarden_extender_model_nodes") == 3


@pytest.mark.parametrize(
    ("cached_nomination", "passed"),
    [
        pytest.param("n", ["n"], id="nomination-seen-by-watch-only-is-used"),
        pytest.param("", [], id="no-nomination-anywhere-victims-count"),
    ],
)
async def test_filter_takes_the_nomination_from_the_watch_when_the_scheduler_copy_lacks_it(
    cached_nomination: str, passed: list[str]
) -> None:
    # the scheduler retries the preemptor before its asynchronous nominatedNodeName patch reached its copy
    m = support_model(
        [support_node("n")], [pod("p", 8, priority=10, nominated=cached_nomination), pod("v", 8, node="n")]
    )
    service = ExtenderService(m, Settings(fleet_max_numa_gpus=4), extender_metrics(CollectorRegistry()))
    args = ExtenderArgs.model_validate({"Pod": pod("p", 8, priority=10), "NodeNames": ["n"]})
    result = ExtenderFilterResult.model_validate_json((await service.filter(args)).to_json())
    assert result.node_names == passed


@pytest.mark.parametrize(
    ("victim_priority", "waits", "passed"),
    [
        pytest.param(0, True, ["n"], id="lower-priority-holder-wait-for-the-watch-then-pass"),
        pytest.param(10, False, [], id="equal-priority-holder-no-wait"),
    ],
)
async def test_filter_gives_the_watch_a_moment_when_a_preemption_may_be_settling(
    victim_priority: int, waits: bool, passed: list[str]
) -> None:
    m = support_model(
        [support_node("n")], [pod("v", 8, node="n", ids="0,1,2,3,4,5,6,7", priority=victim_priority)]
    )
    slept: list[float] = []

    async def watch_delivers_the_deletion(seconds: float) -> None:
        slept.append(seconds)
        m.delete_pod("ml/v")

    service = ExtenderService(
        m,
        Settings(fleet_max_numa_gpus=4),
        extender_metrics(CollectorRegistry()),
        sleep=watch_delivers_the_deletion,
    )
    args = ExtenderArgs.model_validate({"Pod": pod("p", 8, priority=10), "NodeNames": ["n"]})
    result = ExtenderFilterResult.model_validate_json((await service.filter(args)).to_json())
    assert result.node_names == passed and bool(slept) is waits


async def test_views_with_in_flight_claims_are_kept_while_nothing_changes() -> None:
    # no watch: this replica's claim stays in flight (the overlay), as while the watch lags under load
    api = FakePodApi([pod("p", 4)])
    m = support_model([support_node("n"), support_node("m")], api.pods.values())
    binder = Binder(api, m, lambda: service.current_settings(), clock=lambda: NOW)
    service = ExtenderService(m, Settings(), extender_metrics(None), binder=binder, clock=lambda: NOW)
    bound = await binder.bind(
        ExtenderBindingArgs(pod_name="p", pod_namespace="ml", pod_uid="uid-p", node="n")
    )
    assert bound.kind == "bound"
    first, again = dict(service._views(["n", "m"])), dict(service._views(["n", "m"]))
    view = first["n"]
    assert view is not None and [c.pod for c in view.claims] == ["ml/p"]
    assert again["n"] is view  # answers cached on it serve the next request too
    assert first["m"] is m.view("m")  # no claim there: the model's own view
    m.upsert_pod(pod("other", 1, node="n", ids="7"))  # the node changed: a new view, the claim still in it
    changed = dict(service._views(["n"]))["n"]
    assert changed is not view and changed is not None and [c.pod for c in changed.claims] == ["ml/p"]
    assert changed.used == frozenset({"7"})


async def test_a_pod_is_read_once_for_its_filter_and_its_prioritize(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.extender import server

    reads: list[str] = []
    real = pod_info

    def counted(obj: dict[str, Any], resource: str) -> PodInfo:
        reads.append("read")
        return real(obj, resource)

    monkeypatch.setattr(server, "pod_info", counted)
    m = support_model([support_node("n")], [])
    service = ExtenderService(m, Settings(fleet_max_numa_gpus=4), extender_metrics(None))
    sent = pod("p", 2, resource_version="7")
    await service.filter(ExtenderArgs.model_validate({"Pod": sent, "NodeNames": ["n"]}))
    await service.prioritize(ExtenderArgs.model_validate({"Pod": sent, "NodeNames": ["n"]}))
    assert reads == ["read"]
    changed = pod("p", 2, resource_version="8")  # e.g. the scheduler's nominatedNodeName patch
    await service.prioritize(ExtenderArgs.model_validate({"Pod": changed, "NodeNames": ["n"]}))
    assert reads == ["read", "read"]
