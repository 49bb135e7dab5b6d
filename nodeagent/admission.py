"""Which pod is the kubelet admitting? The device plugin's answer to GetPreferredAllocation, decided purely.

Why it exists: the kubelet's device-plugin calls carry device ids, never the pod (kubernetes#63048, #81442,
#107244 closed without change), so a plugin that wants to hand out a *chosen* set has to infer the pod.
HAMi takes a node lock from bind to Allocate (serialised binds, dangling locks, #1130, #1271) and falls back
to "first pending pod in list order"; gpushare matches by requested amount and swaps equal-sized pods
(gpushare-device-plugin#26). Our rule, from what the kubelet guarantees:

* the kubelet admits pods one at a time, in creation-time order (`HandlePodAdditions` sorts by
  creationTimestamp), and records each container's devices before the next admission starts;
* so the pod being admitted is the **oldest** pod bound to this node that carries a recorded GPU set
  (`gpuwarden.io/gpu-ids`) of which part is still unallocated, whose unallocated part fits the request
  (every id available, at least the requested size), and that the kubelet has not started (no container
  running); among those, one whose unallocated part is exactly the requested size comes first, because
  pods created in the same second tie on creationTimestamp.

A wrong inference is never a double hand-out: the kubelet only offers *available* devices and we only
prefer among them; and the reconcile loop then records the actual set and counts the override. When no pod
qualifies the answer is "no preference" and the kubelet picks (the reconcile loop records what it picked).

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuwarden.wellknown import canonical_gpu_ids as canonical
from gpuwarden.wellknown import gpu_id_key as id_key


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod bound to this node, as the admission guess needs it."""

    namespace: str
    name: str
    created: str
    """metadata.creationTimestamp (RFC 3339; sorts as text)."""
    recorded: tuple[str, ...]
    started: bool
    """Any container running or terminated: the kubelet admitted it already."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Preference:
    """The ids to prefer (empty: no preference) and the pod they were chosen for."""

    ids: tuple[str, ...]
    pod: tuple[str, str] | None
    reason: str


def candidate(obj: Mapping[str, object], recorded: tuple[str, ...] | None) -> Candidate | None:
    """A Candidate from a pod object, or None when it has no recorded set or is finished/terminating."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    assert isinstance(meta, Mapping) and isinstance(status, Mapping)
    if not recorded or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    statuses = status.get("containerStatuses") or []
    started = any(
        isinstance(s, Mapping) and isinstance(s.get("state"), Mapping) and not s["state"].get("waiting")
        for s in statuses
    )
    return Candidate(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        created=str(meta.get("creationTimestamp", "")),
        recorded=recorded,
        started=started,
    )


def prefer(
    candidates: Iterable[Candidate],
    allocated: Mapping[tuple[str, str], Sequence[str]],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> Preference:
    """GetPreferredAllocation for one container: the recorded ids of the pod being admitted, if any fits.

    `allocated`: per pod, the ids the kubelet already gave its containers (PodResources). `available`,
    `must_include`, `size`: the kubelet's request.
    """
    free = set(available)
    fits: list[tuple[Candidate, list[str]]] = []
    for c in sorted(candidates, key=lambda c: (c.created, c.namespace, c.name)):
        if c.started:
            continue
        taken = set(allocated.get(c.key, ()))
        remaining = [i for i in c.recorded if i not in taken]
        if remaining and len(remaining) >= size and set(remaining) <= free:
            fits.append((c, remaining))
    # Pods created in the same second tie on creationTimestamp (the kubelet's sort is not stable), so a
    # pod whose unallocated set is exactly this request's size goes first; a larger one is a multi-container
    # pod getting its first container's share.
    exact = [f for f in fits if len(f[1]) == size and f[0].created == fits[0][0].created]
    if fits:
        c, remaining = (exact or fits)[0]
        chosen = list(canonical(must_include))
        for gpu in sorted(remaining, key=id_key):
            if len(chosen) >= size:
                break
            if gpu not in chosen:
                chosen.append(gpu)
        if len(chosen) != size:
            return Preference((), c.key, "must-include devices exceed the request")
        return Preference(tuple(chosen), c.key, f"recorded set of {c.namespace}/{c.name}")
    return Preference((), None, "no pending pod with a recorded GPU set")
