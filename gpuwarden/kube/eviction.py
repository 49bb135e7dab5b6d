"""The Eviction API (`policy/v1`): the one way gpuwarden moves a running pod, so PodDisruptionBudgets hold.

Why a module: the nomination escalation and the drain loop both evict; the request (an Eviction with the
pod's uid as precondition, so a re-created pod of the same name is never evicted by mistake) is built here
once. A refusal by a PDB arrives as a `KubeError` with status 429; callers decide what it means.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpuwarden.kube.resources import PODS, JsonObject


class RequestClient(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        body: Any = None,
        content_type: str | None = None,
    ) -> JsonObject: ...


def eviction_body(namespace: str, name: str, uid: str) -> JsonObject:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


async def evict(client: RequestClient, namespace: str, name: str, uid: str) -> JsonObject:
    """POST the pod's `eviction` subresource (raises `KubeError`; 429 = a PodDisruptionBudget refuses)."""
    return await client.request(
        "POST", PODS.path(namespace, name, "eviction"), verb="create", resource="pods/eviction",
        body=eviction_body(namespace, name, uid), content_type="application/json",
    )  # fmt: skip
