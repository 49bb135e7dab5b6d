"""Which objects a `labelSelector` picks: an in-memory label index kept current by a watch.

Why: a Pods-metric HPA sends its scale target's selector with every request, and only pods matching it may
be averaged (anything else skews the replica count). prometheus-adapter LISTs pods on every request; at
1,000 HPAs that is 4,000 LISTs a minute against the API server. Here pods and nodes are watched once
(metadata only: name, namespace, labels), and a selector is answered from memory through an inverted index
of `key=value` postings, with per-namespace memoization invalidated on change.

`LabelIndex` is pure bookkeeping (table-tested); `watch_objects` is the shell that feeds it from
`gpuwarden.kube.Informer` over a `MetadataSource`: the API server sends metadata only (no spec, no status),
and each object is stripped to name, namespace, labels and resourceVersion (`slim`) as soon as its list page
or watch event is decoded. Collecting a complete list of full pods first held ~400 MiB at 50,000 pods (and
the process kept it: freed dicts leave the allocator's arenas fragmented), against tens of MiB this way.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

from adapter.resources import NODES, PODS, GroupResource
from adapter.selectors import Selector
from gpuwarden.kube import (
    ADDED,
    DELETED,
    MODIFIED,
    SYNCED,
    Informer,
    JsonObject,
    KubeClient,
    MetadataSource,
    WatchEvent,
)
from gpuwarden.kube import NODES as KUBE_NODES
from gpuwarden.kube import PODS as KUBE_PODS

log = logging.getLogger(__name__)

WATCHED = {PODS: KUBE_PODS, NODES: KUBE_NODES}


Postings = dict[tuple[str, str], "str | dict[str, None]"]
"""`key=value` → the names carrying it: a bare name while there is one (most `pod-template-hash`, `app` and
`statefulset.kubernetes.io/pod-name` values), from the second on an insertion-ordered dict used as a set
(about half the size of a `set`; a one-element set would cost 216 bytes)."""


@dataclass(slots=True)
class _Namespace:
    labels: dict[str, Mapping[str, str]]
    postings: Postings
    memo: dict[str, list[str]]


def _post(postings: Postings, item: tuple[str, str], name: str) -> None:
    held = postings.get(item)
    if held is None:
        postings[item] = name
    elif isinstance(held, str):
        if held != name:
            postings[item] = {held: None, name: None}
    else:
        held[name] = None


def _unpost(postings: Postings, item: tuple[str, str], name: str) -> None:
    held = postings.get(item)
    if isinstance(held, str):
        if held == name:
            del postings[item]
    elif held is not None:
        held.pop(name, None)
        if len(held) == 1:
            postings[item] = next(iter(held))
        elif not held:
            del postings[item]


def _posted(postings: Postings, item: tuple[str, str]) -> Iterable[str]:
    held = postings.get(item)
    if held is None:
        return ()
    return (held,) if isinstance(held, str) else held.keys()


LabelKey = tuple[tuple[str, str], ...]


class LabelIndex:
    """name → labels per (resource, namespace), with `key=value` postings and memoized selector answers.

    Objects with equal labels share one (read-only) mapping: the replicas of a Deployment or Job carry the
    same labels, so 50,000 pods hold a few thousand label dicts, not 50,000; the informer's objects are
    handed the same mapping (`apply`). Keys and values are interned.
    """

    def __init__(self, resources: Iterable[GroupResource]) -> None:
        self._spaces: dict[tuple[GroupResource, str], _Namespace] = {}
        self._synced: dict[GroupResource, bool] = dict.fromkeys(resources, False)
        self._shared: dict[LabelKey, tuple[Mapping[str, str], int]] = {}
        self.on_synced: Callable[[], None] | None = None
        """Called once, when the last of the resources completes its first list."""

    def supports(self, gr: GroupResource) -> bool:
        return gr in self._synced

    def synced(self, gr: GroupResource) -> bool:
        return self._synced.get(gr, False)

    def mark_synced(self, gr: GroupResource) -> None:
        first = not all(self._synced.values())
        self._synced[gr] = True
        # label sets `canonical` registered for objects that never reached `upsert` (unchanged on a relist,
        # deleted unseen) are dropped here
        self._shared = {key: held for key, held in self._shared.items() if held[1] > 0}
        if first and all(self._synced.values()) and self.on_synced is not None:
            self.on_synced()

    def unsynced(self) -> list[GroupResource]:
        """The supported resources whose first list has not completed (requests for them answer 503)."""
        return [gr for gr, done in self._synced.items() if not done]

    def _space(self, gr: GroupResource, namespace: str) -> _Namespace:
        space = self._spaces.get((gr, namespace))
        if space is None:
            space = self._spaces[(gr, sys.intern(namespace))] = _Namespace({}, {}, {})
        return space

    def _acquire(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        key: LabelKey = tuple(sorted((sys.intern(k), sys.intern(v)) for k, v in labels.items()))
        held = self._shared.get(key)
        if held is None:
            mapping: Mapping[str, str] = dict(key)
            self._shared[key] = (mapping, 1)
            return mapping
        self._shared[key] = (held[0], held[1] + 1)
        return held[0]

    def canonical(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        """The shared mapping equal to `labels`, registered unreferenced when new (`upsert` takes it over).

        For the informer's transform: a list page's objects then hold shared labels from the moment they are
        decoded, and the decoded label dicts die with their page. Replacing them only when the events are
        applied, after the whole list, freed 50,000 small dicts at once and left the allocator's pools full
        of holes (~10 MiB of RSS at 50,000 pods that the process kept).
        """
        key: LabelKey = tuple(sorted((sys.intern(k), sys.intern(v)) for k, v in labels.items()))
        held = self._shared.get(key)
        if held is not None:
            return held[0]
        mapping: Mapping[str, str] = dict(key)
        self._shared[key] = (mapping, 0)
        return mapping

    def _release(self, labels: Mapping[str, str]) -> None:
        key: LabelKey = tuple(sorted(labels.items()))
        held = self._shared.get(key)
        if held is None:
            return
        if held[1] <= 1:
            del self._shared[key]
        else:
            self._shared[key] = (held[0], held[1] - 1)

    def upsert(
        self, gr: GroupResource, namespace: str, name: str, labels: Mapping[str, str]
    ) -> Mapping[str, str]:
        """Index `name` with `labels`; returns the shared, interned mapping kept, for callers to hold."""
        space = self._space(gr, namespace)
        old = space.labels.get(name)
        if old == labels:
            return old
        if old is not None:
            self._drop(space, name, old)
        shared = self._acquire(labels)
        name = sys.intern(name)
        space.labels[name] = shared
        for item in shared.items():
            _post(space.postings, item, name)
        space.memo.clear()
        return shared

    def delete(self, gr: GroupResource, namespace: str, name: str) -> None:
        space = self._spaces.get((gr, namespace))
        if space is None or name not in space.labels:
            return
        self._drop(space, name, space.labels.pop(name))
        space.memo.clear()

    def _drop(self, space: _Namespace, name: str, labels: Mapping[str, str]) -> None:
        for item in labels.items():
            _unpost(space.postings, item, name)
        self._release(labels)

    def shared_label_sets(self) -> int:
        """Distinct label mappings held (for tests and benchmarks)."""
        return len(self._shared)

    def names(self, gr: GroupResource, namespace: str, selector: Selector) -> list[str]:
        """Sorted names of `gr` objects in `namespace` ("" for root-scoped) matching `selector`."""
        space = self._spaces.get((gr, namespace))
        if space is None:
            return []
        key = str(selector)
        hit = space.memo.get(key)
        if hit is not None:
            return hit
        candidates: set[str] | None = None
        for req in selector.requirements:
            if req.op in ("=", "==", "in"):
                union: set[str] = set()
                for value in req.values:
                    union.update(_posted(space.postings, (req.key, value)))
                candidates = union if candidates is None else candidates & union
        pool: Iterable[str] = space.labels if candidates is None else candidates
        found = sorted(n for n in pool if selector.matches(space.labels[n]))
        if len(space.memo) > 256:
            space.memo.clear()
        space.memo[key] = found
        return found

    def count(self) -> int:
        return sum(len(s.labels) for s in self._spaces.values())

    def labels_of(self, gr: GroupResource, namespace: str, name: str) -> Mapping[str, str] | None:
        """The labels of one object, or None if it is not known (metrics.k8s.io's `pods "x" not found`)."""
        space = self._spaces.get((gr, namespace))
        return space.labels.get(name) if space is not None else None

    def namespaces(self, gr: GroupResource) -> list[str]:
        """Sorted namespaces holding at least one `gr` object ("" for root-scoped ones)."""
        return sorted(ns for (g, ns), space in self._spaces.items() if g == gr and space.labels)


def slim(
    obj: JsonObject, canonical: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None
) -> JsonObject:
    """Only what the index and the informer need: name, namespace, labels, resourceVersion; labels through
    `canonical` when given (`LabelIndex.canonical`)."""
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "labels", "resourceVersion") if k in meta}
    if isinstance(keep.get("namespace"), str):
        keep["namespace"] = sys.intern(keep["namespace"])  # one string per namespace, not one per pod
    if canonical is not None and isinstance(keep.get("labels"), dict):
        keep["labels"] = canonical(keep["labels"])
    return {"metadata": keep}


def apply(index: LabelIndex, gr: GroupResource, event: WatchEvent) -> None:
    """Feed one informer event into the index."""
    if event.type == SYNCED:
        if not index.synced(gr):
            log.info("object index synced", extra={"resource": str(gr), "objects": index.count()})
        index.mark_synced(gr)
        return
    meta = event.object.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    if event.type in (ADDED, MODIFIED):
        # the informer keeps this object too: let it hold the index's interned labels, not a second copy
        meta["labels"] = index.upsert(gr, namespace, name, meta.get("labels") or {})
    elif event.type == DELETED:
        index.delete(gr, namespace, name)


async def watch_objects(client: KubeClient, index: LabelIndex, gr: GroupResource) -> None:
    """Keep `index` current for `gr` (pods or nodes) until cancelled."""
    informer = Informer(
        MetadataSource(client, transform=partial(slim, canonical=index.canonical)), WATCHED[gr]
    )
    events: AsyncIterator[WatchEvent] = informer.events()
    async for event in events:
        apply(index, gr, event)
