"""The pod/node label index: selector answers, updates, memo invalidation, feeding it from watch events."""

from __future__ import annotations

import pytest

from adapter.objects import LabelIndex, apply, slim
from adapter.resources import NODES, PODS
from adapter.selectors import parse
from gpuwarden.kube import ADDED, DELETED, MODIFIED, SYNCED, WatchEvent

PODS_ML = {
    "llm-0": {"app": "llm", "tier": "gpu"},
    "llm-1": {"app": "llm", "tier": "gpu", "canary": "true"},
    "web-0": {"app": "web"},
    "bare": {},
}


@pytest.fixture
def index() -> LabelIndex:
    idx = LabelIndex([PODS, NODES])
    for name, labels in PODS_ML.items():
        idx.upsert(PODS, "ml", name, labels)
    idx.upsert(PODS, "other", "llm-9", {"app": "llm"})
    return idx


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        pytest.param("", ["bare", "llm-0", "llm-1", "web-0"], id="everything"),
        pytest.param("app=llm", ["llm-0", "llm-1"], id="equality-uses-postings"),
        pytest.param("app in (llm,web)", ["llm-0", "llm-1", "web-0"], id="in"),
        pytest.param("app=llm,!canary", ["llm-0"], id="and-not-exists"),
        pytest.param("app!=llm", ["bare", "web-0"], id="not-equals-includes-unlabelled"),
        pytest.param("app notin (web)", ["bare", "llm-0", "llm-1"], id="notin"),
        pytest.param("canary", ["llm-1"], id="exists"),
        pytest.param("app=none", [], id="no-match"),
    ],
)
def test_names_match_selector_within_the_namespace(
    index: LabelIndex, selector: str, names: list[str]
) -> None:
    assert index.names(PODS, "ml", parse(selector)) == names


def test_updates_invalidate_memoized_answers(index: LabelIndex) -> None:
    sel = parse("app=llm")
    assert index.names(PODS, "ml", sel) == ["llm-0", "llm-1"]
    index.upsert(PODS, "ml", "web-0", {"app": "llm"})
    assert index.names(PODS, "ml", sel) == ["llm-0", "llm-1", "web-0"]
    index.delete(PODS, "ml", "llm-0")
    assert index.names(PODS, "ml", sel) == ["llm-1", "web-0"]
    index.upsert(PODS, "ml", "llm-1", {"app": "other"})
    assert index.names(PODS, "ml", sel) == ["web-0"]
    assert index.names(PODS, "other", sel) == ["llm-9"]
    assert index.names(PODS, "missing-namespace", sel) == []


def test_sync_state_per_resource() -> None:
    idx = LabelIndex([PODS, NODES])
    assert idx.supports(PODS) and idx.supports(NODES)
    assert not idx.synced(PODS)
    assert idx.unsynced() == [PODS, NODES]
    apply(idx, PODS, WatchEvent(SYNCED, {}))
    assert idx.synced(PODS)
    assert idx.unsynced() == [NODES]
    apply(idx, NODES, WatchEvent(SYNCED, {}))
    assert idx.unsynced() == []
    assert not LabelIndex([PODS]).supports(NODES)


def test_watch_events_feed_the_index() -> None:
    idx = LabelIndex([NODES])
    node = {"metadata": {"name": "n1", "labels": {"pool": "a100"}, "resourceVersion": "1"}}
    apply(idx, NODES, WatchEvent(ADDED, node))
    assert idx.names(NODES, "", parse("pool=a100")) == ["n1"]
    apply(idx, NODES, WatchEvent(MODIFIED, {"metadata": {"name": "n1", "labels": {"pool": "h100"}}}))
    assert idx.names(NODES, "", parse("pool=a100")) == []
    apply(idx, NODES, WatchEvent(DELETED, node))
    assert idx.count() == 0


def test_slim_keeps_only_metadata_the_index_needs() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "labels": {"a": "b"},
            "resourceVersion": "7",
            "annotations": {"big": "x" * 1000},
            "managedFields": [{}],
        },
        "spec": {"containers": [{}]},
        "status": {"phase": "Running"},
    }
    assert slim(pod) == {
        "metadata": {"name": "p", "namespace": "ml", "labels": {"a": "b"}, "resourceVersion": "7"}
    }


def test_equal_labels_share_one_mapping_across_namespaces_until_the_last_goes() -> None:
    idx = LabelIndex([PODS])
    kept = [idx.upsert(PODS, f"ns-{i}", f"web-{i}", {"app": "web", "hash": "abc"}) for i in range(3)]
    assert kept[0] is kept[1] is kept[2]
    other = idx.upsert(PODS, "ns-0", "db-0", {"app": "db"})
    assert idx.shared_label_sets() == 2
    idx.upsert(PODS, "ns-0", "web-0", {"app": "web", "hash": "def"})  # relabelled: a third set
    assert idx.shared_label_sets() == 3
    idx.delete(PODS, "ns-1", "web-1")
    idx.delete(PODS, "ns-2", "web-2")  # the last holder of {app: web, hash: abc}
    assert idx.shared_label_sets() == 2
    assert other == {"app": "db"}
    assert idx.upsert(PODS, "ns-5", "web-5", {"app": "web", "hash": "abc"}) == {"app": "web", "hash": "abc"}


OPS: list[tuple[str, str, dict[str, str] | None]] = [
    ("a", "ml", {"app": "x", "tier": "gpu"}),
    ("b", "ml", {"app": "x", "tier": "gpu"}),
    ("c", "ml", {"app": "y"}),
    ("b", "ml", {"app": "y", "tier": "gpu"}),  # moves between postings
    ("a", "ml", None),  # the posting app=x had one name left, now none
    ("d", "ml", {"app": "y", "tier": "cpu"}),
    ("c", "ml", None),
    ("b", "ml", {"app": "y", "tier": "gpu"}),  # an unchanged upsert
    ("e", "ml", {"app": "x"}),
    ("d", "ml", None),
]
SELECTORS = ["", "app=x", "app=y", "tier=gpu", "app in (x,y),tier", "app=y,tier!=gpu", "tier=cpu"]


@pytest.mark.parametrize("steps", range(1, len(OPS) + 1))
def test_postings_agree_with_a_full_scan_after_every_change(steps: int) -> None:
    idx, truth = LabelIndex([PODS]), {}
    for name, namespace, labels in OPS[:steps]:
        if labels is None:
            idx.delete(PODS, namespace, name)
            truth.pop(name, None)
        else:
            idx.upsert(PODS, namespace, name, labels)
            truth[name] = labels
    for text in SELECTORS:
        selector = parse(text)
        expected = sorted(n for n, labels in truth.items() if selector.matches(labels))
        assert idx.names(PODS, "ml", selector) == expected, text


def test_slim_interns_the_namespace() -> None:
    a = slim({"metadata": {"name": "p", "namespace": "".join(["team", "-a"])}})
    b = slim({"metadata": {"name": "q", "namespace": "".join(["team", "-", "a"])}})
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]


def test_canonical_labels_are_the_ones_upsert_shares_and_unused_ones_go_at_sync() -> None:
    idx = LabelIndex([PODS])
    first = idx.canonical({"app": "llm", "tier": "gpu"})
    assert idx.canonical({"tier": "gpu", "app": "llm"}) is first  # registered before any upsert
    pod = slim(
        {"metadata": {"name": "p", "namespace": "ml", "labels": {"app": "llm", "tier": "gpu"}}}, idx.canonical
    )
    assert pod["metadata"]["labels"] is first
    apply(idx, PODS, WatchEvent(ADDED, pod))
    assert pod["metadata"]["labels"] is first
    idx.canonical({"app": "gone"})  # e.g. a listed object that never became an event
    assert idx.shared_label_sets() == 2
    apply(idx, PODS, WatchEvent(SYNCED, {}))
    assert idx.shared_label_sets() == 1  # the unreferenced set is dropped, the held one stays
    assert idx.canonical({"app": "llm", "tier": "gpu"}) is first
    apply(idx, PODS, WatchEvent(DELETED, pod))
    assert idx.shared_label_sets() == 0


def test_on_synced_is_called_once_when_every_resource_has_listed() -> None:
    calls: list[str] = []
    index = LabelIndex([PODS, NODES])
    index.on_synced = lambda: calls.append("synced")
    index.mark_synced(PODS)
    assert calls == []
    index.mark_synced(NODES)
    assert calls == ["synced"]
    index.mark_synced(PODS)  # a relist marks it again: not a first sync
    assert calls == ["synced"]
