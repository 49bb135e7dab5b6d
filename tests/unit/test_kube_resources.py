"""Resource paths, cache keys and JSON pointers (gpuwarden.kube.resources)."""

from __future__ import annotations

import pytest

from gpuwarden.kube.resources import EVENTS, LEASES, NODES, PODS, Resource, json_pointer, object_key

NRT = Resource("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", "NodeResourceTopology", False)


@pytest.mark.parametrize(
    ("resource", "namespace", "name", "subresource", "path"),
    [
        pytest.param(NODES, None, None, None, "/api/v1/nodes", id="core-cluster-collection"),
        pytest.param(NODES, None, "gpu-0", None, "/api/v1/nodes/gpu-0", id="core-cluster-object"),
        pytest.param(NODES, None, "gpu-0", "status", "/api/v1/nodes/gpu-0/status", id="status-subresource"),
        pytest.param(PODS, None, None, None, "/api/v1/pods", id="namespaced-all-namespaces"),
        pytest.param(PODS, "ml", "p", None, "/api/v1/namespaces/ml/pods/p", id="namespaced-object"),
        pytest.param(
            LEASES,
            "kube-system",
            "gw",
            None,
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gw",
            id="group-namespaced",
        ),
        pytest.param(
            EVENTS,
            "default",
            None,
            None,
            "/apis/events.k8s.io/v1/namespaces/default/events",
            id="events-collection",
        ),
        pytest.param(
            NRT,
            None,
            "gpu-0",
            None,
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/gpu-0",
            id="crd-cluster-scoped",
        ),
        pytest.param(NODES, None, "a/b", None, "/api/v1/nodes/a%2Fb", id="name-is-escaped"),
    ],
)
def test_path(
    resource: Resource, namespace: str | None, name: str | None, subresource: str | None, path: str
) -> None:
    assert resource.path(namespace, name, subresource) == path


@pytest.mark.parametrize(
    ("resource", "namespace", "name", "subresource"),
    [
        pytest.param(NODES, "default", "x", None, id="namespace-on-cluster-scoped"),
        pytest.param(NODES, None, None, "status", id="subresource-without-name"),
        pytest.param(NODES, None, "", None, id="empty-name"),
    ],
)
def test_path_rejects(
    resource: Resource, namespace: str | None, name: str | None, subresource: str | None
) -> None:
    with pytest.raises(ValueError):
        resource.path(namespace, name, subresource)


def test_api_version() -> None:
    assert NODES.api_version == "v1"
    assert LEASES.api_version == "coordination.k8s.io/v1"


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        pytest.param({"metadata": {"name": "gpu-0"}}, "gpu-0", id="cluster-scoped"),
        pytest.param({"metadata": {"name": "p", "namespace": "ml"}}, "ml/p", id="namespaced"),
        pytest.param({}, "", id="no-metadata"),
    ],
)
def test_object_key(obj: dict[str, object], key: str) -> None:
    assert object_key(obj) == key


@pytest.mark.parametrize(
    ("parts", "pointer"),
    [
        pytest.param(
            ("metadata", "annotations", "gpuwarden.io/quarantine"),
            "/metadata/annotations/gpuwarden.io~1quarantine",
            id="slash-escaped",
        ),
        pytest.param(("a~b",), "/a~0b", id="tilde-escaped"),
        pytest.param(("spec", "taints", "-"), "/spec/taints/-", id="append"),
        pytest.param((), "", id="root"),
    ],
)
def test_json_pointer(parts: tuple[str, ...], pointer: str) -> None:
    assert json_pointer(*parts) == pointer
