"""The one way gpuwarden talks to the Kubernetes API: config loading and an async facade over `kubernetes`.

Why it exists: `gpuwarden.kube` is the one Kubernetes access module (docs/architecture.md) and this is its
client; nothing else calls the API, so error mapping and request metrics live in one place. The official
client is synchronous, untyped and raises its own exceptions. Requests (get, list, create, patch, delete, raw
`request`) and watches are native-async: over aiohttp's keep-alive pool (`transport.py`; large bodies decoded
on a bounded thread pool), so a burst of calls waits on the network, not on threads, or, for the node
agent's few requests, over plain asyncio streams (`minihttp.py`, `http="streams"`: no aiohttp in memory).
A configured proxy sends requests and watches through the `kubernetes` client on thread pools instead.
Connection facts come from `connection.py` when plain (no `kubernetes` import), else from `kubernetes`.
Objects are plain JSON dicts (`_preload_content=False` and `json.loads`), never the generated models,
because model deserialization of a 5,000-node list costs seconds of CPU. Failures come out as
`gpuwarden.errors.KubeError` subclasses (see `status.py`) and every request is counted in
`gpuwarden_kube_requests_total{verb,resource,outcome}`.

What it must not do: read `~/.kube/config` (or `$KUBECONFIG`) unless a path is passed explicitly, touch the
`kubernetes` package's process-global default configuration, retry on its own (callers own retry policy:
`patch.py`, `watch.py`, `leader.py`), or know about nodes, taints or any other domain concept.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from gpuwarden import __version__
from gpuwarden.errors import ConfigError, KubeError
from gpuwarden.kube.connection import Connection, from_kubeconfig
from gpuwarden.kube.connection import in_cluster as in_cluster_connection
from gpuwarden.kube.metrics import kube_metrics
from gpuwarden.kube.protobuf import ACCEPT as PROTOBUF_ACCEPT
from gpuwarden.kube.protobuf import ObjectDecoder, decode_list, is_protobuf
from gpuwarden.kube.resources import JsonObject, ObjectList, PatchType, Resource
from gpuwarden.kube.status import (
    error_from_api_exception,
    error_from_status,
    error_from_transport,
    outcome_of,
)
from gpuwarden.kube.stream import AnyWatchStream, AsyncWatchStream, WatchStream
from gpuwarden.kube.wire import parse_object

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpuwarden.kube.minihttp import MiniTransport
    from gpuwarden.kube.transport import AsyncTransport
    from gpuwarden.litemetrics import Registry

T = TypeVar("T")
Query = list[tuple[str, str]]
Transform = Callable[[JsonObject], JsonObject]
"""Reduces one decoded object to what a caller keeps (applied page by page, so full objects never pile up)."""

JSON = "application/json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
"""Accept headers asking for metadata only (client-go's metadata informers): the API server then sends
`PartialObjectMetadata` (name, namespace, labels, annotations, ownerReferences, resourceVersion, ...; no
spec, no status) for list items and watch events; the plain `application/json` after it is the fallback
for a server that cannot convert."""


def load_configuration(
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
) -> Any:
    """How to reach the API server from `kubeconfig` (+ `context`) or the service account: a `Connection`
    when the plain fields say it all (`connection.py`), else a fresh `kubernetes.client.Configuration`.

    `in_cluster=None` means "in-cluster when no kubeconfig is given". The user's default kubeconfig is never
    read implicitly. Errors are `ConfigError`s naming the `kubernetes.*` field to fix.
    """
    if kubeconfig is not None and in_cluster:
        raise ConfigError([("kubernetes.in_cluster", "set either in_cluster or kubeconfig, not both")])
    plain = (
        from_kubeconfig(Path(kubeconfig), context)
        if kubeconfig is not None
        else (in_cluster_connection(os.environ) if in_cluster is not False else None)
    )
    if plain is not None:
        return plain  # the common cases, without importing `kubernetes` (connection.py says why)
    from kubernetes.client import Configuration
    from kubernetes.config import ConfigException, load_incluster_config, load_kube_config

    configuration = Configuration()
    if kubeconfig is not None:
        try:
            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.fspath(kubeconfig),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise ConfigError(
                [("kubernetes.kubeconfig", f"cannot load {os.fspath(kubeconfig)!r}: {exc}")]
            ) from exc
        return configuration
    if in_cluster is False:
        raise ConfigError(
            [("kubernetes.kubeconfig", "no kubeconfig given and in_cluster is false; set a kubeconfig path")]
        )
    try:
        load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        raise ConfigError(
            [("kubernetes.kubeconfig", f"not running in a cluster ({exc}); set a kubeconfig path explicitly")]
        ) from exc
    return configuration


class KubeClient:
    """Async, raw-JSON access to the API server; one per process, closed with `aclose()` (or `async with`)."""

    def __init__(
        self,
        configuration: Any,
        *,
        max_workers: int = 4,
        max_watches: int = 16,
        max_connections: int = 32,
        credential_ttl: float = 1.0,
        request_timeout: float = 30.0,
        field_manager: str = "gpuwarden",
        registry: CollectorRegistry | Registry | None = None,
        http: Literal["aiohttp", "streams"] = "aiohttp",
    ) -> None:
        self._configuration = configuration
        self.user_agent = f"gpuwarden/{__version__}"
        self._api = (
            None
            if isinstance(configuration, Connection)
            else self._api_client(configuration, max_workers + max_watches)
        )
        """The `kubernetes` client, for the threaded path (a proxy) and watches without our transport;
        None for a `Connection`, which always has our transport."""
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="kube")
        self._watch_pool = ThreadPoolExecutor(max_watches, thread_name_prefix="kube-watch")
        self.request_timeout = request_timeout
        self.field_manager = field_manager
        self.metrics = kube_metrics(registry)
        self._transport: AsyncTransport | MiniTransport | None = None
        """Requests and watches go here (native async); None (a proxy is configured): the thread pool.
        `http="aiohttp"`: a keep-alive pool (`transport.py`), for heavy traffic; `"streams"`: a connection
        per request on plain asyncio (`minihttp.py`), for the node agent's few requests without aiohttp."""
        if not getattr(configuration, "proxy", None):
            if http == "streams":
                from gpuwarden.kube.minihttp import MiniTransport

                self._transport = MiniTransport(
                    configuration, timeout=request_timeout, user_agent=self.user_agent,
                    decode_pool=self._pool, credential_ttl=credential_ttl,
                )  # fmt: skip
            else:
                from gpuwarden.kube.transport import AsyncTransport

                self._transport = AsyncTransport(
                    configuration, max_connections=max_connections, max_watches=max_watches,
                    timeout=request_timeout, user_agent=self.user_agent, decode_pool=self._pool,
                    credential_ttl=credential_ttl,
                )  # fmt: skip

    def _api_client(self, configuration: Any, pool_size: int) -> Any:
        from kubernetes.client import ApiClient
        from urllib3.util.retry import Retry

        configuration.connection_pool_maxsize = pool_size
        # urllib3 would otherwise retry on its own (and sleep out a 503's Retry-After on a pool thread).
        # Only a refused connection is retried once: the request was never sent, so that is always safe.
        configuration.retries = Retry(
            total=None, connect=1, read=0, redirect=0, status=0, other=0, respect_retry_after_header=False
        )
        configuration.client_go_retries = False
        api = ApiClient(configuration)
        api.user_agent = self.user_agent
        return api

    @classmethod
    def from_config(
        cls,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        in_cluster: bool | None = None,
        **kwargs: Any,
    ) -> KubeClient:
        """`load_configuration(...)` then a client; keyword arguments go to the constructor."""
        return cls(
            load_configuration(kubeconfig=kubeconfig, context=context, in_cluster=in_cluster), **kwargs
        )

    @property
    def host(self) -> str:
        """The API server URL."""
        return str(self._configuration.host)

    # --- the blocking part, always on a pool thread ------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        content_type: str | None,
        timeout: float | tuple[float, float],
        accept: str = JSON,
    ) -> Any:
        """Perform one request; return the urllib3 response (2xx, body unread) or raise a `KubeError`."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        api = self._api
        assert api is not None, "a Connection always has the async transport"
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            method, url, headers, body, _ = api.param_serialize(
                method, path, query_params=query or None, header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )  # fmt: skip
            response = api.call_api(method, url, headers, body, _request_timeout=timeout).response
        except ApiException as exc:
            raise error_from_api_exception(exc) from None
        except (HTTPError, OSError) as exc:
            raise error_from_transport(exc) from None
        if not 200 <= response.status <= 299:
            try:
                data = response.data
            except (HTTPError, OSError):
                data = b""
            finally:
                response.release_conn()
            raise error_from_status(
                response.status, data, dict(response.headers), http_reason=response.reason or ""
            )
        return response

    def _request_json(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        content_type: str | None,
        accept: str = JSON,
    ) -> JsonObject:
        from urllib3.exceptions import HTTPError

        response = self._send(method, path, query, body, content_type, self.request_timeout, accept)
        try:
            data = response.data
        except (HTTPError, OSError) as exc:
            raise error_from_transport(exc) from None
        finally:
            response.release_conn()
        return parse_object(data, response.status)

    # --- async facade ---------------------------------------------------------------------------------------

    async def _in_pool(self, verb: str, resource: str, fn: Callable[[], T], pool: ThreadPoolExecutor) -> T:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(pool, fn)
        except KubeError as exc:
            self.metrics.requests.labels(verb, resource, outcome_of(exc)).inc()
            raise
        self.metrics.requests.labels(verb, resource, "success").inc()
        return result

    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        query: Query | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = JSON,
    ) -> JsonObject:
        """One request to an arbitrary API path, answered as a JSON object; the other methods use this."""
        if self._transport is not None:
            try:
                answer = await self._transport.send(method, path, query, body, content_type, accept)
                parsed = await self._transport.decode(answer)
            except KubeError as exc:
                self.metrics.requests.labels(verb, resource, outcome_of(exc)).inc()
                raise
            self.metrics.requests.labels(verb, resource, "success").inc()
            return parsed
        call = functools.partial(self._request_json, method, path, query, body, content_type, accept)
        return await self._in_pool(verb, resource, call, self._pool)

    @property
    def speaks_protobuf(self) -> bool:
        """Whether lists and watches can be asked for as protobuf (`protobuf=` of `list_page`, `watch`): on
        the native-async transports; the threaded path (a proxy) stays JSON."""
        return self._transport is not None

    async def _list_protobuf(
        self, resource: Resource, path: str, query: Query, decode: ObjectDecoder
    ) -> JsonObject:
        """A list asked for as protobuf (JSON accepted too): the list object as the JSON path gives it, each
        protobuf item through `decode`."""
        assert self._transport is not None
        try:
            answer = await self._transport.send("GET", path, query, None, None, PROTOBUF_ACCEPT)
            if is_protobuf(answer.body):
                parsed = decode_list(answer.body, decode, resource.api_version, resource.kind)
            else:  # the server answered JSON (it cannot encode this kind as protobuf)
                parsed = await self._transport.decode(answer)
        except KubeError as exc:
            self.metrics.requests.labels("list", resource.plural, outcome_of(exc)).inc()
            raise
        self.metrics.requests.labels("list", resource.plural, "success").inc()
        return parsed

    def _write_query(self, dry_run: bool) -> Query:
        query: Query = [("fieldManager", self.field_manager)]
        if dry_run:
            query.append(("dryRun", "All"))
        return query

    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> JsonObject:
        """GET one object (raises `KubeNotFound` when absent)."""
        path = resource.path(namespace, name, subresource)
        return await self.request("GET", path, verb="get", resource=resource.plural)

    async def list_page(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
        continue_token: str | None = None,
        resource_version: str | None = None,
        metadata_only: bool = False,
        protobuf: ObjectDecoder | None = None,
    ) -> JsonObject:
        """One page of a list (the raw `...List` object with `metadata.continue` when more pages follow);
        `metadata_only` asks for a `PartialObjectMetadataList` (items without spec and status); `protobuf`
        asks for protobuf (when `speaks_protobuf`) and decodes each protobuf item with it (JSON answers
        keep their items as they are)."""
        query: Query = []
        for key, value in (
            ("labelSelector", label_selector),
            ("fieldSelector", field_selector),
            ("limit", str(limit) if limit else None),
            ("continue", continue_token),
            ("resourceVersion", resource_version),
        ):
            if value:
                query.append((key, value))
        if protobuf is not None and not metadata_only and self.speaks_protobuf:
            return await self._list_protobuf(resource, resource.path(namespace), query, protobuf)
        return await self.request(
            "GET", resource.path(namespace), verb="list", resource=resource.plural, query=query,
            accept=METADATA_LIST if metadata_only else JSON,
        )  # fmt: skip

    async def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
        metadata_only: bool = False,
        transform: Transform | None = None,
        protobuf: ObjectDecoder | None = None,
    ) -> ObjectList:
        """A consistent list over all pages (items get `apiVersion`/`kind`); an expired continue token
        surfaces as `KubeGone`.

        `metadata_only` lists `PartialObjectMetadata` (see `list_page`); `transform` is applied to each item
        as soon as its page is decoded, and the page is dropped before the next is fetched, so what a caller
        does not keep is never held for the whole list (50,000 full pods are hundreds of MiB of dicts).
        `protobuf`: see `list_page`.
        """
        items: list[JsonObject] = []
        token: str | None = None
        while True:
            page = await self.list_page(
                resource,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=limit,
                continue_token=token,
                metadata_only=metadata_only,
                protobuf=protobuf,
            )
            for item in page.get("items") or []:
                # List items come without apiVersion/kind; watch events and GETs carry them. Make them alike.
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
                items.append(item if transform is None else transform(item))
            meta = page.get("metadata") or {}
            del page
            token = meta.get("continue") or None
            if not token:
                return ObjectList(items=items, resource_version=str(meta.get("resourceVersion", "")))

    async def create(
        self, resource: Resource, body: JsonObject, *, namespace: str | None = None, dry_run: bool = False
    ) -> JsonObject:
        """POST a new object (`KubeConflict` with reason `AlreadyExists` when the name is taken)."""
        return await self.request(
            "POST", resource.path(namespace), verb="create", resource=resource.plural,
            query=self._write_query(dry_run), body=body, content_type="application/json",
        )  # fmt: skip

    async def replace(
        self,
        resource: Resource,
        name: str,
        body: JsonObject,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObject:
        """PUT a whole object; `metadata.resourceVersion` in `body` makes it conditional (`KubeConflict`)."""
        return await self.request(
            "PUT", resource.path(namespace, name, subresource), verb="update", resource=resource.plural,
            query=self._write_query(dry_run), body=body, content_type="application/json",
        )  # fmt: skip

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: JsonObject | list[JsonObject],
        *,
        patch_type: PatchType = PatchType.MERGE,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObject:
        """PATCH an object (or its `status` subresource) with one of the three patch types."""
        if (patch_type is PatchType.JSON) != isinstance(body, list):
            raise TypeError("a JSON patch is a list of operations; merge patches are objects")
        return await self.request(
            "PATCH", resource.path(namespace, name, subresource), verb="patch", resource=resource.plural,
            query=self._write_query(dry_run), body=body, content_type=patch_type.value,
        )  # fmt: skip

    async def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None, dry_run: bool = False
    ) -> JsonObject:
        """DELETE an object; returns the final object or a `Status`."""
        query: Query = [("dryRun", "All")] if dry_run else []
        path = resource.path(namespace, name)
        return await self.request("DELETE", path, verb="delete", resource=resource.plural, query=query)

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        allow_bookmarks: bool = True,
        metadata_only: bool = False,
        protobuf: ObjectDecoder | None = None,
    ) -> AnyWatchStream:
        """A raw watch from `resource_version`: iterate `{"type", "object"}` dicts; close with `aclose()`.

        `metadata_only` asks for `PartialObjectMetadata` objects (no spec, no status) in the events;
        `protobuf` asks for protobuf frames (when `speaks_protobuf`) and decodes each event's object with
        it (ERROR events carry their `Status` as JSON does; a JSON answer is read as JSON)."""
        query: Query = [("watch", "true"), ("resourceVersion", resource_version)]
        query.append(("timeoutSeconds", str(timeout_seconds)))
        if allow_bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        # The server ends a watch after timeoutSeconds; a read stalled well beyond that is a dead connection.
        timeout = (self.request_timeout, float(timeout_seconds) + 30.0)
        use_protobuf = protobuf is not None and not metadata_only and self.speaks_protobuf
        accept = METADATA_WATCH if metadata_only else PROTOBUF_ACCEPT if use_protobuf else JSON
        counter = self.metrics.requests

        def count(outcome: str) -> None:
            counter.labels("watch", resource.plural, outcome).inc()

        if self._transport is not None:
            transport = self._transport
            return AsyncWatchStream(
                lambda: transport.open_stream(resource.path(namespace), query, accept, timeout[1]),
                count,
                decode=protobuf if use_protobuf else None,
            )
        opener = functools.partial(
            self._send, "GET", resource.path(namespace), query, None, None, timeout, accept
        )
        return WatchStream(opener, self._watch_pool, count)

    async def aclose(self) -> None:
        """Stop the pools and close pooled connections."""
        if self._transport is not None:
            await self._transport.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._watch_pool.shutdown(wait=False, cancel_futures=True)
        if self._api is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._api.rest_client.close)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
