"""The route table: custom-metrics-apiserver's conformance paths, every §1.2/§1.3 shape, and bad input."""

from __future__ import annotations

import pytest

from adapter.errors import BadRequest, NotFound
from adapter.resources import GroupResource
from adapter.routing import CustomRoute, DiscoveryRoute, ExternalRoute, route

C1, C2 = "/apis/custom.metrics.k8s.io/v1beta1", "/apis/custom.metrics.k8s.io/v1beta2"
E1 = "/apis/external.metrics.k8s.io/v1beta1"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/apis", DiscoveryRoute(), id="apis"),
        pytest.param("/apis/", DiscoveryRoute(), id="apis-slash"),
        pytest.param("/apis/custom.metrics.k8s.io", DiscoveryRoute("custom.metrics.k8s.io"), id="group"),
        pytest.param(C1, DiscoveryRoute("custom.metrics.k8s.io", "v1beta1"), id="custom-v1beta1"),
        pytest.param(C2 + "/", DiscoveryRoute("custom.metrics.k8s.io", "v1beta2"), id="custom-v1beta2-slash"),
        pytest.param(E1, DiscoveryRoute("external.metrics.k8s.io", "v1beta1"), id="external-v1beta1"),
    ],
)
def test_discovery_routes(path: str, expected: DiscoveryRoute) -> None:
    assert route(path, {}) == expected


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        pytest.param(
            f"{C1}/nodes/*/some-metric", ("v1beta1", "nodes", "", "", "*", "some-metric"), id="all-nodes"
        ),
        pytest.param(
            f"{C1}/nodes/%2A/some-metric",
            ("v1beta1", "nodes", "", "", "*", "some-metric"),
            id="encoded-wildcard",
        ),
        pytest.param(
            f"{C2}/nodes/foo/some-metric",
            ("v1beta2", "nodes", "", "", "foo", "some-metric"),
            id="single-node",
        ),
        pytest.param(
            f"{C2}/namespaces/ns/pods/*/some-metric",
            ("v1beta2", "pods", "", "ns", "*", "some-metric"),
            id="all-pods",
        ),
        pytest.param(
            f"{C2}/namespaces/ns/pods/foo/some-metric",
            ("v1beta2", "pods", "", "ns", "foo", "some-metric"),
            id="single-pod",
        ),
        pytest.param(
            f"{C2}/namespaces/ns/metrics/queue",
            ("v1beta2", "namespaces", "", "", "ns", "queue"),
            id="namespace-metric-rewritten",
        ),
        pytest.param(
            f"{C2}/namespaces/ml/deployments.apps/llm/qps",
            ("v1beta2", "deployments", "apps", "ml", "llm", "qps"),
            id="grouped-resource",
        ),
        pytest.param(
            f"{C2}/namespaces/ml/deployment/llm/qps",
            ("v1beta2", "deployments", "apps", "ml", "llm", "qps"),
            id="singular-resource-normalized",
        ),
        pytest.param(
            f"{C2}/namespaces/ns/pods/p/metric.with.dots",
            ("v1beta2", "pods", "", "ns", "p", "metric.with.dots"),
            id="dotted-metric",
        ),
    ],
)
def test_custom_routes(path: str, shape: tuple[str, str, str, str, str, str]) -> None:
    got = route(path, {})
    assert isinstance(got, CustomRoute)
    version, resource, group, namespace, name, metric = shape
    assert (got.version, got.resource, got.namespace, got.name, got.metric) == (
        version,
        GroupResource(resource, group),
        namespace,
        name,
        metric,
    )


def test_selectors_are_parsed_from_the_query() -> None:
    got = route(
        f"{C2}/namespaces/ml/pods/*/m", {"labelSelector": "app=llm", "metricLabelSelector": "code in (2)"}
    )
    assert isinstance(got, CustomRoute)
    assert (str(got.label_selector), str(got.metric_selector)) == ("app=llm", "code in (2)")
    assert got.template == "custom_wildcard"


def test_external_route() -> None:
    got = route(f"{E1}/namespaces/ml/queue_depth", {"labelSelector": "queue=a"})
    assert isinstance(got, ExternalRoute)
    assert (got.namespace, got.metric, str(got.selector)) == ("ml", "queue_depth", "queue=a")


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("//apis/", id="long-prefix"),
        pytest.param(f"{C1}/blah", id="root-missing-storage"),
        pytest.param(f"{C1}/nodes/foo", id="root-resource-leaf"),
        pytest.param(f"{C1}/namespaces/ns/pods/bar", id="namespaced-resource-leaf"),
        pytest.param(f"{C1}/namespaces/ns/pods/bar/m/extra", id="too-long"),
        pytest.param(f"{E1}/nonexistent-metric", id="external-no-namespace"),
        pytest.param(f"{E1}/namespaces/foo", id="external-namespace-only"),
        pytest.param(f"{E1}/namespaces/foo/group/metric", id="external-metric-with-slashes"),
        pytest.param("/apis/other.k8s.io/v1beta1", id="other-group"),
        pytest.param("/apis/metrics.k8s.io/v1", id="metrics-v1-not-served"),
        pytest.param("/apis/metrics.k8s.io/v1beta1/namespaces/ns", id="metrics-namespace-only"),
        pytest.param("/apis/metrics.k8s.io/v1beta1/pods/x", id="metrics-pod-without-namespace"),
        pytest.param("/apis/metrics.k8s.io/v1beta1/nodes/a/b", id="metrics-node-subpath"),
        pytest.param("/apis/custom.metrics.k8s.io/v2", id="unknown-version"),
        pytest.param("/api/v1", id="core-api"),
        pytest.param(f"{C1}/nodes//m", id="empty-segment"),
    ],
)
def test_unknown_shapes_are_404(path: str) -> None:
    with pytest.raises(NotFound):
        route(path, {})


@pytest.mark.parametrize(
    ("path", "query", "message"),
    [
        pytest.param(f"{C2}/namespaces/ML/pods/*/m", {}, "invalid namespace", id="namespace-not-dns"),
        pytest.param(f"{C2}/namespaces/ml/pods/a%22b/m", {}, "invalid object name", id="quote-in-name"),
        pytest.param(
            f"{C2}/namespaces/ml/pods/*/a%2Fb", {}, "invalid metric name", id="encoded-slash-in-metric"
        ),
        pytest.param(f"{C2}/namespaces/ml/pods/*/..", {}, "invalid metric name", id="dot-dot"),
        pytest.param(f"{C2}/namespaces/ml/pods/*/a%25b", {}, "invalid metric name", id="percent"),
        pytest.param(f"{C2}/namespaces/ml/Pods!/*/m", {}, "invalid resource", id="bad-resource"),
        pytest.param(
            f"{C2}/namespaces/ml/pods/*/m", {"labelSelector": "a in ("}, "labelSelector", id="bad-selector"
        ),
        pytest.param(
            f"{C2}/namespaces/ml/pods/*/m",
            {"metricLabelSelector": "=x"},
            "metricLabelSelector",
            id="bad-metric-selector",
        ),
        pytest.param(f"{C2}/namespaces/*/m", {}, "multiple namespaces", id="namespaces-wildcard"),
        pytest.param(
            f"{E1}/namespaces/ml/m", {"labelSelector": "!"}, "labelSelector", id="external-bad-selector"
        ),
    ],
)
def test_malformed_input_is_400_naming_the_problem(path: str, query: dict[str, str], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        route(path, query)
