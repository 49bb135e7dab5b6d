"""The claim protocol's pure parts: patches, label values, and who wins when two binds overlap."""

from __future__ import annotations

import pytest

from controller.gpus.claims import (
    claim_patch,
    claim_selector,
    conflicts,
    holds,
    label_value,
    release_patch,
    reusable_claim,
)
from controller.gpus.fit import Choice
from controller.gpus.objects import PodInfo, pod_info
from tests.unit.extender_support import RESOURCE, pod

NOW, TTL = 1000.0, 60.0


def test_claim_patch_is_conditional_and_complete() -> None:
    patch = claim_patch("gpu-node-2", Choice(("4", "5"), (1,), "nvlink", 9), 1000.25, "42")
    assert patch == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {"gpuwarden.io/gpu-node": "gpu-node-2"},
            "annotations": {
                "gpuwarden.io/gpu-ids": "4,5",
                "gpuwarden.io/numa-node": "1",
                "gpuwarden.io/gpu-node": "gpu-node-2",
                "gpuwarden.io/gpu-claimed-at": "1000.250",
            },
        }
    }
    unknown_numa = claim_patch("n", Choice(("0",), (), "single", 5), 1.0, "1")
    assert unknown_numa["metadata"]["annotations"]["gpuwarden.io/numa-node"] is None


def test_release_patch_removes_every_claim_key() -> None:
    meta = release_patch()["metadata"]
    assert meta["labels"] == {"gpuwarden.io/gpu-node": None}
    assert set(meta["annotations"]) == {
        "gpuwarden.io/gpu-ids",
        "gpuwarden.io/numa-node",
        "gpuwarden.io/gpu-node",
        "gpuwarden.io/gpu-claimed-at",
        "gpuwarden.io/gpu-reserved-until",
    }
    assert all(v is None for v in meta["annotations"].values())


def test_label_value_hashes_names_labels_cannot_hold() -> None:
    assert label_value("ip-10-0-0-1.ec2.internal") == "ip-10-0-0-1.ec2.internal"
    long = "n" * 64
    assert label_value(long).startswith("h-") and len(label_value(long)) <= 63
    assert label_value(long) == label_value(long) != label_value("m" * 64)
    assert claim_selector("a") == "gpuwarden.io/gpu-node=a"


def info(**kw: object) -> PodInfo:
    base = {"key": "ml/o", "uid": "o", "gpus": 2, "gpu_ids": ("0", "1")}
    base.update(kw)
    return PodInfo(**base)  # type: ignore[arg-type]


HOLDS = [
    ("bound-here", info(node_name="n"), True),
    ("bound-elsewhere", info(node_name="m", claim_node="n"), False),
    ("fresh-claim", info(claim_node="n", claimed_at=NOW - 10), True),
    ("expired-claim", info(claim_node="n", claimed_at=NOW - 61), False),
    ("claim-without-time-is-fresh", info(claim_node="n"), True),
    ("claim-on-other-node", info(claim_node="m", claimed_at=NOW), False),
    ("terminated", info(node_name="n", terminated=True), False),
    ("no-ids", info(node_name="n", gpu_ids=None), False),
]


@pytest.mark.parametrize(("pod", "expected"), [h[1:] for h in HOLDS], ids=[h[0] for h in HOLDS])
def test_holds(pod: PodInfo, expected: bool) -> None:
    assert holds(pod, "n", NOW, TTL) is expected


def test_conflicts_name_the_other_holder_and_the_gpus() -> None:
    others = [
        info(key="ml/me", claim_node="n", claimed_at=NOW, gpu_ids=("2", "3")),
        info(key="ml/b", node_name="n", gpu_ids=("3", "4")),
        info(key="ml/a", claim_node="n", claimed_at=NOW - 1, gpu_ids=("10", "2")),
        info(key="ml/c", claim_node="n", claimed_at=NOW - 100, gpu_ids=("2",)),
        info(key="ml/d", node_name="n", gpu_ids=("6",)),
    ]
    assert conflicts("ml/me", "n", ["2", "3"], others, NOW, TTL) == [("ml/a", ("2",)), ("ml/b", ("3",))]
    assert conflicts("ml/me", "n", ["7"], others, NOW, TTL) == []


def test_reusable_claim_only_for_a_fresh_complete_claim_on_the_same_node() -> None:
    mine = pod_info(pod("p", 2, ids="0,1", claim=("n", NOW - 1)), RESOURCE)
    assert reusable_claim(mine, "n", NOW, TTL) == ("0", "1")
    assert reusable_claim(mine, "m", NOW, TTL) is None
    assert reusable_claim(mine, "n", NOW + 100, TTL) is None
    partial = pod_info(pod("p", 4, ids="0,1", claim=("n", NOW)), RESOURCE)
    assert reusable_claim(partial, "n", NOW, TTL) is None
    bound = pod_info(pod("p", 2, node="n", ids="0,1", claim=("n", NOW)), RESOURCE)
    assert reusable_claim(bound, "n", NOW, TTL) is None
