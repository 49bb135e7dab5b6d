"""Proof (b): the aggregation layer reaches a process on this machine.

An APIService backed by an ExternalName Service -> 127.0.0.1 points at a tiny HTTPS server written in the
test (conftest.AggregatedServer, serving cert checked through the APIService caBundle, client cert required
from the front-proxy CA). kube-aggregator's availability probe marks it Available, ``kubectl get --raw``
reaches it through kube-apiserver, and the server sees the proxied user's identity in the front-proxy
headers.
"""

from __future__ import annotations

import json

import pytest

from harness.testbed import Cluster
from harness.testbed.pki import FRONT_PROXY_CLIENT_CN
from tests.e2e.conftest import AggregatedServer

pytestmark = pytest.mark.e2e

GROUP, VERSION = "testbed.gpuwarden.io", "v1alpha1"


def test_apiservice_available_and_proxied_with_front_proxy_identity(
    cluster: Cluster, aggregated_server: AggregatedServer
) -> None:
    reg = aggregated_server.register(
        GROUP,
        VERSION,
        [{"name": "probes", "singularName": "probe", "namespaced": True, "kind": "Probe", "verbs": ["get"]}],
    )
    cond = aggregated_server.wait_available(reg)
    assert cond["status"] == "True", cond

    # The availability controller probed us through the front proxy, as system:kube-aggregator.
    probes = [
        r for r in aggregated_server.requests if r.headers.get("X-Remote-User") == "system:kube-aggregator"
    ]
    assert probes, [vars(r) for r in aggregated_server.requests]

    before = len(aggregated_server.requests)
    body = json.loads(cluster.kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}"))
    assert body["kind"] == "APIResourceList"
    assert body["groupVersion"] == f"{GROUP}/{VERSION}"
    assert [r["name"] for r in body["resources"]] == ["probes"]

    who = json.loads(cluster.kubectl("auth", "whoami", "-o", "json"))["status"]["userInfo"]
    proxied = [
        r
        for r in aggregated_server.requests[before:]
        if r.path == f"/apis/{GROUP}/{VERSION}" and r.headers.get("X-Remote-User") == who["username"]
    ]
    assert proxied, [vars(r) for r in aggregated_server.requests[before:]]
    req = proxied[-1]
    assert req.peer_cn == FRONT_PROXY_CLIENT_CN, "request did not come with the API server's front-proxy cert"
    assert set(who.get("groups", [])) <= set(req.remote_groups), (who, req.remote_groups)

    # Discovery through the aggregator lists the group too.
    groups = json.loads(cluster.kubectl("get", "--raw", "/apis"))["groups"]
    assert GROUP in {g["name"] for g in groups}
