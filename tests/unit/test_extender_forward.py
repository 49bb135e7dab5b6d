"""Two extender replicas over HTTP under the leader bind protocol: the follower forwards bind to the binder.

Each replica is a real aiohttp server with its own model over one in-memory API server; the scheduler's
requests go to either. What must hold: every GPU pod is bound by the binder with one write, wherever the
request landed; a forwarded bind is never forwarded again; an unreachable or missing binder is an `Error`
the scheduler retries on, never an exception or a 5xx; and the URL a replica advertises is derived as
documented.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from controller.extender.bind import Binder
from controller.extender.forward import Forwarder, advertised_url
from controller.extender.metrics import extender_metrics
from controller.extender.runtime import binder_advertisement
from controller.extender.server import ExtenderService, add_extender_routes
from controller.extenderv1 import ExtenderBindingArgs, ExtenderBindingResult
from controller.gpus.fit import Settings
from gpuwarden.config.extender import ExtenderConfig
from tests.unit.extender_support import FakePodApi, model, node, pod

NOW = 1_700_000_000.0
PREFIX = "/gpuwarden"


class Lease:
    def __init__(self, fenced: bool) -> None:
        self.is_fenced = fenced
        self.acquired_rv = ""

    def fenced(self) -> bool:
        return self.is_fenced


@dataclass
class Replica:
    service: ExtenderService
    lease: Lease
    registry: CollectorRegistry
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url(PREFIX))

    def forwarded(self, outcome: str) -> float:
        value = self.registry.get_sample_value(
            "gpuwarden_extender_binds_forwarded_total", {"outcome": outcome}
        )
        return value or 0.0


async def start(api: FakePodApi, lease: Lease, binder_url: list[str]) -> Replica:
    registry = CollectorRegistry()
    m = model([node("n")], api.pods.values())
    binder = Binder(api, m, lambda: Settings(fleet_max_numa_gpus=4), clock=lambda: NOW, sole=lease)
    service = ExtenderService(m, Settings(), extender_metrics(registry), binder=binder, clock=lambda: NOW)
    app = web.Application()
    add_extender_routes(app, service, PREFIX)
    server = TestServer(app)
    await server.start_server()
    service.forwarder = Forwarder(lambda: binder_url[0], own_url=str(server.make_url(PREFIX)), timeout=2)
    service.is_binder = lease.fenced
    return Replica(service, lease, registry, server)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FakePodApi, Replica, Replica, list[str]]]:
    api = FakePodApi([pod(f"p{i}", k) for i, k in enumerate((4, 2, 1, 1))])
    where: list[str] = [""]
    binder, follower = await start(api, Lease(True), where), await start(api, Lease(False), where)
    where[0] = binder.url  # what the Lease advertises
    yield api, binder, follower, where
    for r in (binder, follower):
        assert r.service.forwarder is not None
        await r.service.forwarder.close()
        await r.server.close()


def bind_args(name: str) -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node="n")


async def test_binds_sent_to_either_replica_are_all_made_by_the_binder_with_one_write_each(pair: Any) -> None:
    api, binder, follower, _ = pair
    replicas = [binder, follower]
    results = await asyncio.gather(
        *(random.Random(i).choice(replicas).service.bind(bind_args(f"p{i}")) for i in range(4))
    )
    assert [r.error for r in results] == [""] * 4
    assert Counter(c.split()[0] for c in api.calls) == Counter({"bind": 4})  # no PATCH, no LIST
    assert all(c.endswith("+annotations") for c in api.calls)
    held: Counter[str] = Counter()
    for obj in api.pods.values():
        held.update(obj["metadata"]["annotations"]["gpuwarden.io/gpu-ids"].split(","))
    assert held == Counter({str(i): 1 for i in range(8)})
    assert follower.forwarded("ok") == sum(
        1 for i in range(4) if random.Random(i).choice(replicas) is follower
    )


async def test_a_forwarded_bind_reaching_a_replica_that_does_not_bind_is_refused_not_passed_on(
    pair: Any,
) -> None:
    api, binder, follower, _ = pair
    binder.lease.is_fenced = False  # the binder lost its fence; the Lease still names it
    result = await follower.service.bind(bind_args("p0"))
    assert "not the binder" in result.error and "retry" in result.error
    assert binder.forwarded("ok") == binder.forwarded("error") == 0  # the binder did not forward it again
    assert not api.calls


async def test_the_lease_naming_this_very_replica_while_unfenced_is_an_error_not_a_loop(pair: Any) -> None:
    api, binder, _, _ = pair
    binder.lease.is_fenced = False
    result = await binder.service.bind(bind_args("p0"))
    assert "not the binder" in result.error
    assert not api.calls


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", "no gpuwarden replica is the binder right now"),
        ("http://127.0.0.1:9/gpuwarden", "to the binder at"),
    ],
    ids=["no-holder", "unreachable"],
)
async def test_no_or_unreachable_binder_is_an_error_the_scheduler_retries_on(
    pair: Any, url: str, expected: str
) -> None:
    api, _, follower, where = pair
    where[0] = url
    result = await follower.service.bind(bind_args("p0"))
    assert isinstance(result, ExtenderBindingResult) and expected in result.error
    assert follower.forwarded("error") == 1 and not api.calls


async def test_the_http_bind_route_of_the_follower_returns_the_binders_answer(pair: Any) -> None:
    api, binder, follower, _ = pair
    async with aiohttp.ClientSession() as session:
        response = await session.post(follower.url + "/bind", data=bind_args("p1").to_json())
        assert response.status == 200
        assert ExtenderBindingResult.model_validate_json(await response.read()).error == ""
    assert api.pods["ml/p1"]["spec"]["nodeName"] == "n"
    registry = binder.registry
    forwarded = registry.get_sample_value(
        "gpuwarden_extender_requests_total", {"verb": "bind_forwarded", "outcome": "ok"}
    )
    assert forwarded == 1


@pytest.mark.parametrize(
    ("section", "environ", "url"),
    [
        (
            {"advertise_url": "http://gw-0.example:8888/gpuwarden/"},
            {"POD_IP": "10.0.0.7"},
            "http://gw-0.example:8888/gpuwarden",
        ),
        ({}, {"POD_IP": "10.0.0.7"}, "http://10.0.0.7:8888/gpuwarden"),
        ({"port": 9443, "path_prefix": ""}, {"POD_IP": "fd00::7"}, "http://[fd00::7]:9443"),
        (
            {"tls": {"cert_file": "/tls/tls.crt", "key_file": "/tls/tls.key"}},
            {"POD_IP": "10.0.0.7"},
            "https://10.0.0.7:8888/gpuwarden",
        ),
        ({}, {}, ""),
    ],
    ids=["configured", "pod-ip", "ipv6-no-prefix", "tls", "unknown"],
)
def test_advertised_url(section: dict[str, Any], environ: dict[str, str], url: str) -> None:
    cfg = ExtenderConfig.model_validate({"path_prefix": "/gpuwarden", **section})
    assert advertised_url(cfg, environ) == url


def test_advertise_url_must_be_an_http_url() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        ExtenderConfig.model_validate({"advertise_url": "10.0.0.7:8888"})


@pytest.mark.parametrize(
    ("section", "pod_ip", "advertised"),
    [
        ({"bind_protocol": "claim"}, "10.0.0.7", {}),
        ({"bind_protocol": "leader"}, "10.0.0.7", {"gpuwarden.io/extender-url": "http://10.0.0.7:8888/gw"}),
        ({"bind_protocol": "leader"}, "", {}),
        ({"bind_protocol": "leader", "enabled": False}, "10.0.0.7", {}),
    ],
    ids=["claim", "leader", "leader-without-address", "extender-off"],
)
def test_what_the_controllers_lease_advertises(
    monkeypatch: pytest.MonkeyPatch, section: dict[str, Any], pod_ip: str, advertised: dict[str, str]
) -> None:
    monkeypatch.setenv("POD_IP", pod_ip)
    cfg = ExtenderConfig.model_validate({"path_prefix": "/gw", **section})
    assert binder_advertisement(cfg) == advertised
