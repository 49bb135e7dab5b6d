"""Patch preconditions and read-compute-write conflict retry (gpuwarden.kube.patch).

The retry loop is driven here by a fake store that enforces resourceVersion preconditions the way the API
server does, and that can inject a competing write between our read and our write; the e2e tier runs two
real concurrent writers against the API server.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuwarden.errors import KubeConflict, KubeNotFound
from gpuwarden.kube.patch import (
    patch_status,
    patch_with_retry,
    status_patch,
    update_with_retry,
    with_precondition,
)
from gpuwarden.kube.resources import NODES, PatchType, Resource


@pytest.mark.parametrize(
    ("patch", "patch_type", "expected"),
    [
        pytest.param(
            {"metadata": {"labels": {"a": "b"}}},
            PatchType.MERGE,
            {"metadata": {"labels": {"a": "b"}, "resourceVersion": "7"}},
            id="merge-keeps-metadata",
        ),
        pytest.param(
            {"spec": {"unschedulable": True}},
            PatchType.STRATEGIC,
            {"spec": {"unschedulable": True}, "metadata": {"resourceVersion": "7"}},
            id="strategic-adds-metadata",
        ),
        pytest.param(
            [{"op": "add", "path": "/spec/taints/-", "value": {"key": "k"}}],
            PatchType.JSON,
            [
                {"op": "add", "path": "/spec/taints/-", "value": {"key": "k"}},
                {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"},
            ],
            id="json-appends-op",
        ),
        pytest.param(
            {"metadata": {"resourceVersion": "1"}},
            PatchType.MERGE,
            {"metadata": {"resourceVersion": "7"}},
            id="stale-rv-overwritten",
        ),
    ],
)
def test_with_precondition(patch: Any, patch_type: PatchType, expected: Any) -> None:
    before = copy.deepcopy(patch)
    assert with_precondition(patch, patch_type, "7") == expected
    assert patch == before  # input untouched


@pytest.mark.parametrize(
    ("patch", "patch_type", "rv", "error"),
    [
        pytest.param({"a": 1}, PatchType.MERGE, "", ValueError, id="no-rv"),
        pytest.param({"a": 1}, PatchType.JSON, "7", TypeError, id="json-needs-list"),
        pytest.param([{"op": "add"}], PatchType.MERGE, "7", TypeError, id="merge-needs-object"),
        pytest.param({"metadata": "x"}, PatchType.MERGE, "7", TypeError, id="metadata-not-object"),
    ],
)
def test_with_precondition_rejects(
    patch: Any, patch_type: PatchType, rv: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        with_precondition(patch, patch_type, rv)


def test_status_patch() -> None:
    assert status_patch({"conditions": [{"type": "GPUHealthy"}]}) == {
        "status": {"conditions": [{"type": "GPUHealthy"}]}
    }


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        elif value is None:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeStore:
    """One object with optimistic concurrency; `interfere` writes run between our get and our write."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.rv = 1
        self.obj["metadata"]["resourceVersion"] = "1"
        self.interfere: list[dict[str, Any]] = []
        self.gets = 0
        self.writes: list[tuple[str, Any, str | None]] = []

    def _bump(self) -> None:
        self.rv += 1
        self.obj["metadata"]["resourceVersion"] = str(self.rv)

    async def get(self, resource: Resource, name: str, **_: Any) -> dict[str, Any]:
        self.gets += 1
        return copy.deepcopy(self.obj)

    def _check(self, rv: str | None) -> None:
        if self.interfere:
            merge(self.obj, self.interfere.pop(0))
            self._bump()
        if rv is not None and rv != self.obj["metadata"]["resourceVersion"]:
            raise KubeConflict("409 the object has been modified", status=409, reason="Conflict")

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: Any,
        *,
        patch_type: PatchType,
        subresource: str | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        self.writes.append(("patch", body, subresource))
        if patch_type is PatchType.JSON:
            rv = next(op["value"] for op in body if op["path"] == "/metadata/resourceVersion")
            self._check(rv)
            raise AssertionError("JSON patch application not modelled")
        body = copy.deepcopy(body)
        self._check(body.get("metadata", {}).pop("resourceVersion", None))
        merge(self.obj, body)
        self._bump()
        return copy.deepcopy(self.obj)

    async def replace(self, resource: Resource, name: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.writes.append(("replace", body, None))
        self._check(body["metadata"].get("resourceVersion"))
        self.obj = copy.deepcopy(body)
        self._bump()
        return copy.deepcopy(self.obj)


def counter_node() -> dict[str, Any]:
    return {"metadata": {"name": "n", "annotations": {"count": "0"}}}


def increment(current: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"annotations": {"count": str(int(current["metadata"]["annotations"]["count"]) + 1)}}}


@pytest.mark.parametrize("conflicts", [0, 1, 4], ids=["no-conflict", "one-conflict", "four-conflicts"])
async def test_patch_with_retry_recomputes_from_fresh_read(conflicts: int) -> None:
    store = FakeStore(counter_node())
    store.interfere = [{"metadata": {"annotations": {"count": str(10 * (i + 1))}}} for i in range(conflicts)]
    result = await patch_with_retry(store, NODES, "n", increment, attempts=5, retry_delay=0)
    # The competing writes set 10, 20, ...; our increment must build on the last one, not on a stale read.
    expected = 10 * conflicts + 1
    assert result["metadata"]["annotations"]["count"] == str(expected)
    assert store.gets == conflicts + 1


async def test_patch_with_retry_gives_up_after_attempts() -> None:
    store = FakeStore(counter_node())
    store.interfere = [{"metadata": {"annotations": {"x": str(i)}}} for i in range(3)]
    with pytest.raises(KubeConflict):
        await patch_with_retry(store, NODES, "n", increment, attempts=3, retry_delay=0)
    assert store.gets == 3


async def test_patch_with_retry_none_means_no_write() -> None:
    store = FakeStore(counter_node())
    result = await patch_with_retry(store, NODES, "n", lambda _obj: None)
    assert store.writes == []
    assert result["metadata"]["resourceVersion"] == "1"


async def test_patch_with_retry_async_compute_and_status_subresource() -> None:
    store = FakeStore(counter_node())

    async def compute(current: dict[str, Any]) -> dict[str, Any]:
        return status_patch({"phase": "checked"})

    await patch_with_retry(store, NODES, "n", compute, subresource="status")
    assert store.writes[0][2] == "status"
    assert store.writes[0][1]["metadata"] == {"resourceVersion": "1"}
    assert store.obj["status"] == {"phase": "checked"}


async def test_patch_with_retry_json_patch_carries_precondition() -> None:
    store = FakeStore(counter_node())
    store.interfere = [{"metadata": {"labels": {"x": "y"}}}] * 2

    def compute(_obj: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"op": "add", "path": "/metadata/labels", "value": {}}]

    with pytest.raises(KubeConflict):
        await patch_with_retry(
            store, NODES, "n", compute, patch_type=PatchType.JSON, attempts=2, retry_delay=0
        )
    assert [w[1][-1]["value"] for w in store.writes] == ["1", "2"]


async def test_patch_with_retry_propagates_not_found() -> None:
    class Missing(FakeStore):
        async def get(self, resource: Resource, name: str, **_: Any) -> dict[str, Any]:
            raise KubeNotFound('404 nodes "n" not found', status=404)

    with pytest.raises(KubeNotFound):
        await patch_with_retry(Missing(counter_node()), NODES, "n", increment)


async def test_patch_status_targets_status_subresource() -> None:
    store = FakeStore(counter_node())
    await patch_status(store, NODES, "n", {"conditions": []})
    assert store.writes == [("patch", {"status": {"conditions": []}}, "status")]


@pytest.mark.parametrize("conflicts", [0, 2], ids=["no-conflict", "two-conflicts"])
async def test_update_with_retry(conflicts: int) -> None:
    store = FakeStore(counter_node())
    store.interfere = [{"metadata": {"annotations": {"count": "5"}}}] * conflicts

    def mutate(obj: dict[str, Any]) -> bool:
        ann = obj["metadata"]["annotations"]
        ann["count"] = str(int(ann["count"]) + 1)
        return True

    result = await update_with_retry(store, NODES, "n", mutate, retry_delay=0)
    assert result["metadata"]["annotations"]["count"] == ("6" if conflicts else "1")
    assert len(store.writes) == conflicts + 1


async def test_update_with_retry_unchanged_means_no_write() -> None:
    store = FakeStore(counter_node())
    await update_with_retry(store, NODES, "n", lambda _obj: False)
    assert store.writes == []


@pytest.mark.parametrize("fn", [patch_with_retry, update_with_retry], ids=["patch", "update"])
async def test_attempts_must_be_positive(fn: Any) -> None:
    with pytest.raises(ValueError):
        await fn(FakeStore(counter_node()), NODES, "n", lambda _o: None, attempts=0)
