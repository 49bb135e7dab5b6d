"""Which objects a `labelSelector` picks: an in-memory label index kept current by a watch.

Why: a Pods-metric HPA sends its scale target's selector with every request, and only pods matching it may
be averaged (anything else skews the replica count). prometheus-adapter LISTs pods on every request; at
1,000 HPAs that is 4,000 LISTs a minute against the API server. Here pods and nodes are watched once
(metadata only: name, namespace, labels), and a selector is answered from memory through an inverted index
of `key=value` postings, with per-namespace memoization invalidated on change.

`LabelIndex` is pure bookkeeping (table-tested); `watch_objects` is the shell that feeds it from
`gpuwarden.kube.Informer`, stripping each object to its metadata so 50,000 pods cost megabytes, not the
gigabyte their full specs would.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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
    ObjectList,
    Resource,
    WatchEvent,
)
from gpuwarden.kube import NODES as KUBE_NODES
from gpuwarden.kube import PODS as KUBE_PODS

log = logging.getLogger(__name__)

WATCHED = {PODS: KUBE_PODS, NODES: KUBE_NODES}


@dataclass
class _Namespace:
    labels: dict[str, Mapping[str, str]]
    postings: dict[tuple[str, str], set[str]]
    memo: dict[str, list[str]]


class LabelIndex:
    """name → labels per (resource, namespace), with `key=value` postings and memoized selector answers."""

    def __init__(self, resources: Iterable[GroupResource]) -> None:
        self._spaces: dict[tuple[GroupResource, str], _Namespace] = {}
        self._synced: dict[GroupResource, bool] = dict.fromkeys(resources, False)

    def supports(self, gr: GroupResource) -> bool:
        return gr in self._synced

    def synced(self, gr: GroupResource) -> bool:
        return self._synced.get(gr, False)

    def mark_synced(self, gr: GroupResource) -> None:
        self._synced[gr] = True

    def _space(self, gr: GroupResource, namespace: str) -> _Namespace:
        space = self._spaces.get((gr, namespace))
        if space is None:
            space = self._spaces[(gr, namespace)] = _Namespace({}, {}, {})
        return space

    def upsert(
        self, gr: GroupResource, namespace: str, name: str, labels: Mapping[str, str]
    ) -> Mapping[str, str]:
        """Index `name` with `labels`; returns the (interned) mapping kept, for callers to share."""
        space = self._space(gr, namespace)
        old = space.labels.get(name)
        if old == labels:
            return old
        if old is not None:
            self._unpost(space, name, old)
        interned = {sys.intern(k): sys.intern(v) for k, v in labels.items()}
        space.labels[sys.intern(name)] = interned
        for item in interned.items():
            space.postings.setdefault(item, set()).add(name)
        space.memo.clear()
        return interned

    def delete(self, gr: GroupResource, namespace: str, name: str) -> None:
        space = self._spaces.get((gr, namespace))
        if space is None or name not in space.labels:
            return
        self._unpost(space, name, space.labels.pop(name))
        space.memo.clear()

    @staticmethod
    def _unpost(space: _Namespace, name: str, labels: Mapping[str, str]) -> None:
        for item in labels.items():
            names = space.postings.get(item)
            if names is not None:
                names.discard(name)
                if not names:
                    del space.postings[item]

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
                    union |= space.postings.get((req.key, value), set())
                candidates = union if candidates is None else candidates & union
        pool: Iterable[str] = space.labels if candidates is None else candidates
        found = sorted(n for n in pool if selector.matches(space.labels[n]))
        if len(space.memo) > 256:
            space.memo.clear()
        space.memo[key] = found
        return found

    def count(self) -> int:
        return sum(len(s.labels) for s in self._spaces.values())


def slim(obj: JsonObject) -> JsonObject:
    """Only what the index and the informer need: name, namespace, labels, resourceVersion."""
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "labels", "resourceVersion") if k in meta}
    return {"metadata": keep}


class _SlimStream:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __aiter__(self) -> _SlimStream:
        return self

    async def __anext__(self) -> JsonObject:
        raw: JsonObject = await self._inner.__anext__()
        if isinstance(raw.get("object"), dict) and raw.get("type") != "ERROR":
            raw = {"type": raw["type"], "object": slim(raw["object"])}
        return raw

    async def aclose(self) -> None:
        await self._inner.aclose()


class SlimSource:
    """A `WatchSource` over `KubeClient` that hands the informer metadata-only objects."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
    ) -> ObjectList:
        listed = await self._client.list_objects(
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
        )
        return ObjectList(items=[slim(o) for o in listed.items], resource_version=listed.resource_version)

    def watch(self, resource: Resource, **kwargs: Any) -> _SlimStream:
        return _SlimStream(self._client.watch(resource, **kwargs))


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
    informer = Informer(SlimSource(client), WATCHED[gr])
    events: AsyncIterator[WatchEvent] = informer.events()
    async for event in events:
        apply(index, gr, event)
