"""Feeding the model: informer events -> ClusterModel, the optional NRT CRD, error trends; config wiring."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.runtime import build_extender
from controller.gpus.feed import NRT, ErrorTrends, ModelFeed, build_gpu_model, trend_query, trends_from_vector
from controller.gpus.fit import Policy, settings_from_config
from controller.gpus.model import ClusterModel
from controller.gpus.objects import DecodedPod, pod_info
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeNotFound, PrometheusServerError
from gpuwarden.kube import KubeClient, ObjectList, Resource
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Sample, Vector
from tests.unit.extender_support import node, nrt, pod
from tests.unit.podproto_support import pod_bytes


class Stream:
    """A watch that delivers `events` and then stays open (like a quiet real watch)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = list(events)

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._events:
            return self._events.pop(0)
        await asyncio.Event().wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        return None


class FakeSource:
    """list + watch per resource plural; `crd_missing` plurals answer 404 like an uninstalled CRD."""

    def __init__(
        self, lists: dict[str, list[dict[str, Any]]], watches: dict[str, list[dict[str, Any]]]
    ) -> None:
        self.lists, self.watches = lists, watches
        self.crd_missing: set[str] = set()
        self.selectors: dict[str, str | None] = {}
        self.decoders: dict[tuple[str, str], Any] = {}
        """(verb, plural) -> the `protobuf=` decoder it was asked with."""

    async def list_objects(self, resource: Resource, **kw: Any) -> ObjectList:
        if resource.plural in self.crd_missing:
            raise KubeNotFound("the server could not find the requested resource", status=404)
        self.selectors[resource.plural] = kw.get("field_selector")
        decode = self.decoders["list", resource.plural] = kw.get("protobuf")
        items = list(self.lists.get(resource.plural, []))
        if decode is not None:  # as the API server's protobuf, through the decoder asked with
            items = [decode(pod_bytes(item)) for item in items]
        return ObjectList(items=items, resource_version="10")

    async def list_page(self, resource: Resource, **kw: Any) -> dict[str, Any]:
        if resource.plural in self.crd_missing:
            raise KubeNotFound("the server could not find the requested resource", status=404)
        return {"items": []}

    def watch(self, resource: Resource, **kw: Any) -> Stream:
        decode = self.decoders["watch", resource.plural] = kw.get("protobuf")
        events = self.watches.pop(resource.plural, [])
        if decode is not None:
            events = [{"type": e["type"], "object": decode(pod_bytes(e["object"]))} for e in events]
        return Stream(events)


async def run_for(coro: Any, until: Any, limit: float = 2.0) -> None:
    task = asyncio.ensure_future(coro)
    try:
        deadline = asyncio.get_running_loop().time() + limit
        while not until():
            assert asyncio.get_running_loop().time() < deadline, "condition not reached"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_feed_syncs_model_and_applies_watch_events() -> None:
    source = FakeSource(
        lists={"nodes": [node("n1"), node("n2")], "pods": [pod("a", 2, node="n1", ids="0,1")],
               "noderesourcetopologies": [nrt("n2", [4, 4])]},
        watches={"pods": [{"type": "ADDED", "object": pod("b", 1, node="n1", ids="5")},
                          {"type": "DELETED", "object": pod("a", 2, node="n1", ids="0,1")}],
                 "nodes": [{"type": "DELETED", "object": node("n2")}]},
    )  # fmt: skip
    model = ClusterModel()
    feed = ModelFeed(cast(KubeClient, source), model, freeze_gc_after_sync=False)
    await run_for(feed.run(), lambda: model.synced and model.pod("ml/a") is None and model.view("n2") is None)
    view = model.view("n1")
    assert view is not None and view.used == frozenset({"5"})
    assert source.selectors["pods"] == "status.phase!=Succeeded,status.phase!=Failed"
    assert feed.nrt_installed


@pytest.mark.parametrize("protobuf", [True, False], ids=["protobuf", "json"])
async def test_feed_lists_and_watches_its_pods_as_protobuf_unless_switched_off(protobuf: bool) -> None:
    source = FakeSource(
        lists={"nodes": [node("n1")], "pods": [pod("a", 2, node="n1", ids="0,1"), pod("c", 1, node="n1")]},
        watches={"pods": [{"type": "ADDED", "object": pod("b", 1, node="n1", ids="5")},
                          {"type": "DELETED", "object": pod("c", 1, node="n1")}]},
    )  # fmt: skip
    config = Config.model_validate({"kubernetes": {"protobuf": protobuf}})
    gpus = build_gpu_model(config, cast(KubeClient, source))
    assert gpus.feed is not None
    await run_for(gpus.feed.run(), lambda: gpus.model.synced and gpus.model.pod("ml/c") is None)
    view = gpus.model.view("n1")
    assert view is not None and view.used == frozenset({"0", "1", "5"})
    listed, watched = source.decoders["list", "pods"], source.decoders["watch", "pods"]
    assert listed is watched
    if protobuf:  # straight into the model's PodInfo (issue 47), the same as read from the pod's JSON
        assert isinstance(listed(pod_bytes(pod("a", 2))), DecodedPod)
        assert gpus.model.pod("ml/a") == pod_info(pod("a", 2, node="n1", ids="0,1"), gpus.model.resource)
    else:
        assert listed is None
    others = {key: decoder for key, decoder in source.decoders.items() if key[1] != "pods"}
    assert ("watch", "nodes") in others and set(others.values()) == {None}  # every other kind: JSON


async def test_feed_without_nrt_crd_rechecks_later() -> None:
    source = FakeSource(lists={"nodes": [node("n")], "pods": []}, watches={})
    source.crd_missing.add(NRT.plural)
    checks: list[float] = []

    async def sleep(seconds: float) -> None:
        checks.append(seconds)
        if len(checks) == 2:
            source.crd_missing.clear()
        await asyncio.sleep(0)

    model = ClusterModel()
    feed = ModelFeed(
        cast(KubeClient, source), model, nrt_recheck_seconds=300, sleep=sleep, freeze_gc_after_sync=False
    )
    await run_for(feed.run(), lambda: model.synced and feed.nrt_installed)
    assert checks == [300, 300]


async def test_feed_follows_device_classes_for_dra_backed_nodes() -> None:
    gpu_class = {
        "metadata": {"name": "gpu.example.com"},
        "spec": {"extendedResourceName": "nvidia.com/gpu"},
    }
    dra = node("d")
    dra["status"] = {"allocatable": {"cpu": "64"}}
    source = FakeSource(
        lists={"nodes": [node("n"), dra], "pods": [], "deviceclasses": [gpu_class]}, watches={}
    )
    model = ClusterModel()
    feed = ModelFeed(cast(KubeClient, source), model, freeze_gc_after_sync=False)

    def dra_seen() -> bool:
        view = model.view("d") if model.synced else None
        return view is not None and view.dra_class == "gpu.example.com"

    await run_for(feed.run(), dra_seen)
    assert model.view("n").dra_class == ""  # type: ignore[union-attr]


async def test_feed_without_device_classes_rechecks_later() -> None:
    source = FakeSource(lists={"nodes": [node("n")], "pods": []}, watches={})
    source.crd_missing.add("deviceclasses")  # an API server before resource.k8s.io/v1 (1.34)
    checks: list[float] = []

    async def sleep(seconds: float) -> None:
        checks.append(seconds)
        await asyncio.sleep(0)

    model = ClusterModel()
    feed = ModelFeed(
        cast(KubeClient, source), model, nrt_recheck_seconds=300, sleep=sleep, freeze_gc_after_sync=False
    )
    await run_for(feed.run(), lambda: model.synced and len(checks) >= 2)
    assert set(checks) == {300}
    assert model.view("n").dra_class == ""  # type: ignore[union-attr]


def test_trend_query_and_parsing() -> None:
    assert trend_query(["Hostname", "hostname"], 'cluster="a"') == (
        'sum by (Hostname, hostname) (increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{cluster="a"}[1h]))'
    )
    vector = Vector(
        samples=[
            Sample({"Hostname": "n1"}, 0, 4.0),
            Sample({"hostname": "n1"}, 0, 1.0),
            Sample({"hostname": "n2"}, 0, float("nan")),
            Sample({"other": "x"}, 0, 9.0),
            Sample({"Hostname": "n3"}, 0, -2.0),
        ]
    )
    assert trends_from_vector(vector, ["Hostname", "hostname"]) == {"n1": 5.0, "n3": 0.0}


class FakeProm:
    def __init__(self) -> None:
        self.fail = False

    async def query(self, promql: str) -> Vector:
        if self.fail:
            raise PrometheusServerError("503", status=503)
        return Vector(samples=[Sample({"Hostname": "n"}, 0, 12.0)])


async def test_error_trends_keep_last_values_then_forget() -> None:
    prom, model = FakeProm(), ClusterModel()
    model.upsert_node(node("n"))
    trends = ErrorTrends(
        cast(PrometheusClient, prom), model, node_labels=["Hostname"], forget_after_failures=2
    )
    assert await trends.refresh() == {"n": 12.0}
    prom.fail = True
    assert await trends.refresh() is None
    assert model.view("n").error_trend == 12.0  # type: ignore[union-attr]
    await trends.refresh()
    assert model.view("n").error_trend is None  # type: ignore[union-attr]


def test_settings_from_config() -> None:
    cfg = Config.model_validate(
        {"extender": {"default_policy": "prefer-numa", "count_nominated_pods": False,
                      "scoring": {"fit_weight": 1, "locality_weight": 3, "error_trend_penalty": 5,
                                  "error_trend_sbe_per_hour": 20}, "claim_ttl_seconds": 15}}
    )  # fmt: skip
    s = settings_from_config(cfg.extender, "example.com/gpu")
    assert s.default_policy is Policy.PREFER_NUMA and not s.count_nominated
    assert (s.fit_weight, s.locality_weight, s.error_trend_penalty, s.error_trend_threshold) == (1, 3, 5, 20)
    assert s.resource == "example.com/gpu" and s.claim_ttl_seconds == 15


async def test_build_extender_mounts_routes_under_the_configured_prefix() -> None:
    cfg = Config.model_validate({"extender": {"path_prefix": "/gw", "topology_source": "annotation"}})
    registry = CollectorRegistry()
    ext = build_extender(cfg, cast(KubeClient, object()), registry=registry)
    app = web.Application()
    ext.mount(app)
    paths = sorted(r.resource.canonical for r in app.router.routes() if r.resource is not None)
    assert paths == ["/gw/bind", "/gw/filter", "/gw/preempt", "/gw/prioritize"]
    assert not ext.ready() and ext.trends is None and ext.model.topology_source == "annotation"
    assert registry.get_sample_value("gpuwarden_extender_model_synced") == 0


async def test_the_leader_bind_protocol_adds_the_route_followers_forward_bind_to() -> None:
    cfg = Config.model_validate({"extender": {"path_prefix": "/gw", "bind_protocol": "leader"}})
    ext = build_extender(cfg, cast(KubeClient, object()))
    app = web.Application()
    ext.mount(app)
    paths = sorted(r.resource.canonical for r in app.router.routes() if r.resource is not None)
    assert paths == ["/gw/bind", "/gw/bind/forwarded", "/gw/filter", "/gw/preempt", "/gw/prioritize"]
    assert ext.service.forwarder is None  # no election here (a single replica): it binds itself
