"""A protobuf `WatchSource`: what an informer of a built-in kind needs when it reads a few fields of many
objects (the GPU model's pods), as client-go informers do (`application/vnd.kubernetes.protobuf`).

Why it exists: kube-scheduler watches pods as protobuf; a JSON watch of the same pods makes the API server
encode every pod event a second time, and makes us parse whole pods (managedFields included) to read a
dozen fields. The caller's `decode` turns an object's message bytes into the JSON-shaped dict its reader
needs (a subset message skips the rest by length). Opt-in per informer:
`Informer(ProtobufSource(client, decode=...), PODS)`.

JSON stays the fallback, and the reader sees JSON-shaped dicts either way: through a proxy (the threaded
client speaks JSON only) and from a server that answers JSON (kinds it cannot encode as protobuf: CRDs),
objects arrive whole, not reduced by `decode`.

What it must not do: interpret objects (the decoder is the caller's) or events (the informer maps ERROR
and reads BOOKMARKs, as for JSON).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.kube.client import KubeClient
from gpuwarden.kube.metrics import KubeMetrics
from gpuwarden.kube.protobuf import ObjectDecoder
from gpuwarden.kube.resources import ObjectList, Resource
from gpuwarden.kube.stream import AnyWatchStream


class ProtobufSource:
    """List and watch `resource` as protobuf through `client`, each object's bytes through `decode`."""

    def __init__(self, client: KubeClient, *, decode: ObjectDecoder) -> None:
        self._client = client
        self._decode = decode

    @property
    def metrics(self) -> KubeMetrics:
        """The client's request metrics (an informer counts its transient failures there)."""
        return self._client.metrics

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
            protobuf=self._decode,
        )

    def watch(self, resource: Resource, **kwargs: Any) -> AnyWatchStream:
        return self._client.watch(resource, protobuf=self._decode, **kwargs)
