"""A metadata-only `WatchSource`: what an informer needs when it keeps names and labels, not whole objects.

Why it exists: a cache of 50,000 pods built from full objects first decodes every pod's spec, status and
managedFields (hundreds of MiB of dicts for a complete list) only to throw nearly all of it away. This
source asks the API server for `PartialObjectMetadata` (what client-go's metadata informers do: no spec, no
status on the wire) and hands each object to a `transform` as soon as its list page or watch event is
decoded, so neither the full list nor full objects are ever held. Opt-in per informer:
`Informer(MetadataSource(client, transform=...), PODS)`; an `Informer(client, ...)` still sees full objects.

What it must not do: interpret objects (the transform is the caller's) or touch ERROR/BOOKMARK events
beyond passing them through (the informer maps ERROR to errors and reads bookmarks' resourceVersion).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.kube.client import KubeClient, Transform
from gpuwarden.kube.resources import JsonObject, ObjectList, Resource
from gpuwarden.kube.stream import AnyWatchStream


def transform_event(raw: JsonObject, transform: Transform) -> JsonObject:
    """A raw watch event with its object transformed; ERROR and BOOKMARK events are returned as they are."""
    obj = raw.get("object")
    if raw.get("type") in ("ERROR", "BOOKMARK") or not isinstance(obj, dict):
        return raw
    return {"type": raw["type"], "object": transform(obj)}


class TransformedStream:
    """A `WatchStream` whose events' objects went through `transform`."""

    def __init__(self, inner: AnyWatchStream, transform: Transform) -> None:
        self._inner = inner
        self._transform = transform

    def __aiter__(self) -> TransformedStream:
        return self

    async def __anext__(self) -> JsonObject:
        return transform_event(await self._inner.__anext__(), self._transform)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _identity(obj: JsonObject) -> JsonObject:
    return obj


class MetadataSource:
    """List and watch `PartialObjectMetadata` through `client`, each object passed through `transform`."""

    def __init__(self, client: KubeClient, *, transform: Transform | None = None) -> None:
        self._client = client
        self._transform = transform or _identity

    async def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
    ) -> ObjectList:
        return await self._client.list_objects(
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            metadata_only=True,
            transform=self._transform,
        )

    def watch(self, resource: Resource, **kwargs: Any) -> TransformedStream:
        return TransformedStream(self._client.watch(resource, metadata_only=True, **kwargs), self._transform)
