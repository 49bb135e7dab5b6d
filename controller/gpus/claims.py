"""The durable GPU claim on a pod, and the rule that keeps two binders from handing out one GPU twice.

Why it exists: bind must record the exact GPU set on the pod *before* creating the Binding, and kube-scheduler
runs binding cycles concurrently - against any extender replica. Our watch cache may lag, so two binds to one
node can choose overlapping GPUs. The protocol (write, then verify with a read sure to hold every earlier
write) is:

1. patch the pod with the claim - annotations `gpuwarden.io/gpu-ids`, `gpuwarden.io/numa-node`,
   `gpuwarden.io/gpu-node` (full node name), `gpuwarden.io/gpu-claimed-at`, and the label
   `gpuwarden.io/gpu-node` (label-safe node name, for selection) - guarded by the pod's resourceVersion, so
   concurrent binds of the *same* pod serialize;
2. read the node's pods as of a moment after that write - from the pod watch once it has delivered our own
   claim (a watch delivers writes in order, so every earlier claim is there too), else a consistent LIST of
   pods with that label - and look for another live holder of any of our GPUs: a pod bound to the node, or
   an unbound pod whose claim is younger than the TTL;
3. on overlap, withdraw our claim and fail the bind (the scheduler retries the pod); else create the Binding.

Of two overlapping claims, the later write always sees the earlier one in step 2, so at most one of them
proceeds (possibly neither; both are retried). Claims of unbound pods expire after the TTL so a crashed
binder cannot pin GPUs forever. Pure: builds patches and judges lists; the I/O is in `bind.py`.

With `extender.bind_protocol: leader` there is one binder at a time (the fenced holder of the controller's
Lease; the other replicas forward bind to it), so no claim needs verifying against another writer: the set
rides on the Binding itself (`binding_annotations`), one write instead of three steps.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from controller.gpus.fit import Choice
from controller.gpus.objects import PodInfo, claim_fresh
from gpuwarden.wellknown import GPU_CLAIMED_AT as CLAIMED_AT_ANNOTATION
from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_NODE as CLAIM_LABEL
from gpuwarden.wellknown import GPU_NODE as CLAIM_NODE_ANNOTATION
from gpuwarden.wellknown import GPU_RESERVED_UNTIL as RESERVED_UNTIL_ANNOTATION
from gpuwarden.wellknown import NUMA_NODE as NUMA_ANNOTATION
from gpuwarden.wellknown import format_gpu_ids
from gpuwarden.wellknown import gpu_id_key as gpu_sort_key

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def label_value(node: str) -> str:
    """The node name as a label value (<= 63 characters); longer names become a stable hash."""
    if len(node) <= 63 and _LABEL_VALUE.match(node):
        return node
    return "h-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def claim_selector(node: str) -> str:
    """Label selector for every pod claiming (or bound with a claim on) `node`."""
    return f"{CLAIM_LABEL}={label_value(node)}"


def claim_patch(
    node: str, choice: Choice, now: float, resource_version: str, reserved_until: float | None = None
) -> dict[str, Any]:
    """JSON merge patch writing the claim; `resourceVersion` makes it conditional (409 on a lost race).
    `reserved_until` makes it a preemption reservation (held until then); on bind's own claim (None)
    a reservation of the pod keeps its deadline (at most that long: a bind that fails holds no longer)."""
    numa = ",".join(str(n) for n in choice.numa_nodes) or None
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {CLAIM_LABEL: label_value(node)},
            "annotations": {
                GPU_IDS_ANNOTATION: format_gpu_ids(choice.ids),
                NUMA_ANNOTATION: numa,
                CLAIM_NODE_ANNOTATION: node,
                CLAIMED_AT_ANNOTATION: f"{now:.3f}",
            },
        }
    }
    if reserved_until is not None:
        patch["metadata"]["annotations"][RESERVED_UNTIL_ANNOTATION] = f"{reserved_until:.3f}"
    return patch


def binding_annotations(node: str, choice: Choice, now: float) -> dict[str, str]:
    """The claim's annotations for a Binding's `metadata.annotations`: the API server copies them onto the
    pod in the bind's own write (kube-apiserver's BindingREST), so the sole binder records the set with
    one write. No label: a Binding carries annotations only (its pods are found by `spec.nodeName`)."""
    annotations = {
        GPU_IDS_ANNOTATION: format_gpu_ids(choice.ids),
        CLAIM_NODE_ANNOTATION: node,
        CLAIMED_AT_ANNOTATION: f"{now:.3f}",
    }
    if choice.numa_nodes:
        annotations[NUMA_ANNOTATION] = ",".join(str(n) for n in choice.numa_nodes)
    return annotations


def release_patch() -> dict[str, Any]:
    """JSON merge patch withdrawing a claim from a pod that is still unbound."""
    keys = (
        GPU_IDS_ANNOTATION, NUMA_ANNOTATION, CLAIM_NODE_ANNOTATION, CLAIMED_AT_ANNOTATION,
        RESERVED_UNTIL_ANNOTATION,
    )  # fmt: skip
    return {"metadata": {"labels": {CLAIM_LABEL: None}, "annotations": dict.fromkeys(keys)}}


def holds(pod: PodInfo, node: str, now: float, ttl: float) -> bool:
    """Whether `pod` currently holds its recorded GPUs on `node` (bound there, or a fresh claim)."""
    if pod.terminated or not pod.gpu_ids:
        return False
    if pod.node_name:
        return pod.node_name == node
    return pod.claim_node == node and claim_fresh(pod.claimed_at, pod.reserved_until, now, ttl)


def conflicts(
    me: str, node: str, ids: Iterable[str], others: Iterable[PodInfo], now: float, ttl: float
) -> list[tuple[str, tuple[str, ...]]]:
    """Other live holders of any of `ids` on `node`: (pod key, overlapping GPU ids), sorted."""
    mine = set(ids)
    out: list[tuple[str, tuple[str, ...]]] = []
    for other in others:
        if other.key == me or not holds(other, node, now, ttl):
            continue
        overlap = mine.intersection(other.gpu_ids or ())
        if overlap:
            out.append((other.key, tuple(sorted(overlap, key=gpu_sort_key))))
    return sorted(out)


def reusable_claim(pod: PodInfo, node: str, now: float, ttl: float) -> tuple[str, ...] | None:
    """The pod's own earlier claim on `node` when a retried bind may reuse it (same node, fresh, complete)."""
    if pod.node_name or pod.claim_node != node or not pod.gpu_ids or len(pod.gpu_ids) != pod.gpus:
        return None
    if not claim_fresh(pod.claimed_at, pod.reserved_until, now, ttl):
        return None
    return pod.gpu_ids
