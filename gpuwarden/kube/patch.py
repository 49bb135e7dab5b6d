"""Patch helpers: the three patch types, the status subresource, and read-compute-write with conflict retry.

Why it exists: a controller that patches from a stale read silently overwrites someone else's change (an
operator's taint, another replica's annotation). The safe shape is client-go's `RetryOnConflict`: read the
object, compute the change *from what was read*, write it conditioned on that read's resourceVersion, and on
409 Conflict read again and recompute. `patch_with_retry` does that for patches (the precondition rides in
the patch itself, see `with_precondition`), `update_with_retry` for whole-object PUTs.

What it must not do: know what is being patched. Domain helpers (taints, conditions, annotations) live with
their loops and pass a `compute` callback here; this module never logs decisions or emits events.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

from gpuwarden.errors import KubeConflict
from gpuwarden.kube.resources import JsonObject, PatchType, Resource, json_pointer, resource_version

PatchBody = JsonObject | list[JsonObject]
Compute = Callable[[JsonObject], PatchBody | Awaitable[PatchBody | None] | None]
Mutate = Callable[[JsonObject], bool | Awaitable[bool]]


class ObjectClient(Protocol):
    """The calls these helpers make; `KubeClient` provides them."""

    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> JsonObject: ...

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: PatchBody,
        *,
        patch_type: PatchType = PatchType.MERGE,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObject: ...

    async def replace(
        self,
        resource: Resource,
        name: str,
        body: JsonObject,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObject: ...


def with_precondition(patch: PatchBody, patch_type: PatchType, rv: str) -> PatchBody:
    """`patch` made conditional on the object still being at resourceVersion `rv` (else 409 Conflict).

    Merge and strategic-merge patches carry `metadata.resourceVersion`; a JSON patch gets a trailing
    `replace` of `/metadata/resourceVersion`. Either way the server compares it with the stored object's
    resourceVersion before writing. The input is not modified.
    """
    if not rv:
        raise ValueError("a precondition needs the resourceVersion of the object the patch was computed from")
    if patch_type is PatchType.JSON:
        if not isinstance(patch, list):
            raise TypeError("a JSON patch is a list of operations")
        return [*patch, {"op": "replace", "path": json_pointer("metadata", "resourceVersion"), "value": rv}]
    if not isinstance(patch, dict):
        raise TypeError("merge and strategic-merge patches are objects")
    conditioned = copy.deepcopy(patch)
    metadata = conditioned.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise TypeError("patch metadata must be an object")
    metadata["resourceVersion"] = rv
    return conditioned


def status_patch(status: JsonObject) -> JsonObject:
    """The merge patch that sets the given `status` fields (for the status subresource)."""
    return {"status": copy.deepcopy(status)}


async def patch_status(
    client: ObjectClient,
    resource: Resource,
    name: str,
    status: JsonObject,
    *,
    namespace: str | None = None,
    patch_type: PatchType = PatchType.MERGE,
    dry_run: bool = False,
) -> JsonObject:
    """Patch the `status` subresource (where controllers write conditions; the main resource ignores it).

    Unconditional: the server applies it to the latest object. Use `patch_with_retry(..., subresource=
    "status")` when the new status depends on the old one.
    """
    return await client.patch(
        resource,
        name,
        status_patch(status),
        patch_type=patch_type,
        namespace=namespace,
        subresource="status",
        dry_run=dry_run,
    )


async def _resolve(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


def _retry_delay(attempt: int, base: float) -> float:
    # client-go's retry.DefaultRetry: a short, jittered, slowly growing pause.
    return base * (1 + attempt) * (0.9 + 0.2 * random.random())


async def patch_with_retry(
    client: ObjectClient,
    resource: Resource,
    name: str,
    compute: Compute,
    *,
    patch_type: PatchType = PatchType.MERGE,
    namespace: str | None = None,
    subresource: str | None = None,
    attempts: int = 5,
    retry_delay: float = 0.01,
    dry_run: bool = False,
) -> JsonObject:
    """Read, `compute(current)` a patch, write it conditioned on the read; on 409 re-read and recompute.

    `compute` (sync or async) returns the patch body, or None when nothing needs to change — then the
    current object is returned without a write. After `attempts` conflicts the last `KubeConflict` is raised.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(attempts):
        current = await client.get(resource, name, namespace=namespace)
        body = await _resolve(compute(copy.deepcopy(current)))
        if body is None:
            return current
        if not isinstance(body, dict | list):
            raise TypeError("compute() must return a patch (dict or list of operations) or None")
        conditioned = with_precondition(body, patch_type, resource_version(current))
        try:
            return await client.patch(
                resource,
                name,
                conditioned,
                patch_type=patch_type,
                namespace=namespace,
                subresource=subresource,
                dry_run=dry_run,
            )
        except KubeConflict:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(_retry_delay(attempt, retry_delay))
    raise AssertionError("unreachable")  # pragma: no cover


async def update_with_retry(
    client: ObjectClient,
    resource: Resource,
    name: str,
    mutate: Mutate,
    *,
    namespace: str | None = None,
    subresource: str | None = None,
    attempts: int = 5,
    retry_delay: float = 0.01,
    dry_run: bool = False,
) -> JsonObject:
    """Read, let `mutate(obj)` change a copy in place (returning whether it changed anything), PUT it
    with the read's resourceVersion; on 409 re-read and mutate again. Unchanged → no write."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(attempts):
        current = await client.get(resource, name, namespace=namespace)
        desired = copy.deepcopy(current)
        if not await _resolve(mutate(desired)):
            return current
        desired.setdefault("metadata", {})["resourceVersion"] = resource_version(current)
        try:
            return await client.replace(
                resource, name, desired, namespace=namespace, subresource=subresource, dry_run=dry_run
            )
        except KubeConflict:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(_retry_delay(attempt, retry_delay))
    raise AssertionError("unreachable")  # pragma: no cover
