"""`transform_event`: which watch events a metadata source transforms and which it passes through."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.kube.metadata import transform_event


def name_only(obj: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": obj["metadata"]["name"]}}


FULL = {"metadata": {"name": "p", "resourceVersion": "7", "managedFields": [{}]}, "spec": {"x": 1}}
STATUS = {"kind": "Status", "code": 410, "metadata": {}}
BOOKMARK = {"kind": "PartialObjectMetadata", "metadata": {"resourceVersion": "9"}}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            {"type": "ADDED", "object": FULL}, {"type": "ADDED", "object": {"metadata": {"name": "p"}}}
        ),
        pytest.param(
            {"type": "MODIFIED", "object": FULL}, {"type": "MODIFIED", "object": {"metadata": {"name": "p"}}}
        ),
        pytest.param(
            {"type": "DELETED", "object": FULL}, {"type": "DELETED", "object": {"metadata": {"name": "p"}}}
        ),
        pytest.param({"type": "ERROR", "object": STATUS}, {"type": "ERROR", "object": STATUS}, id="error"),
        pytest.param({"type": "BOOKMARK", "object": BOOKMARK}, {"type": "BOOKMARK", "object": BOOKMARK}),
        pytest.param({"type": "ADDED"}, {"type": "ADDED"}, id="no-object"),
    ],
)
def test_transform_event(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    assert transform_event(raw, name_only) == expected
