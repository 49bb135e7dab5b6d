"""The leader bind protocol: the fenced Lease holder binds with one write (the Binding carries the GPU set).

What must hold: one API write per GPU pod; nothing written while not fenced; concurrent binds in the binder
never overlap (its in-flight claims); a binder that just took over chooses from a consistent read until its
watch has passed the write that made it leader, so a predecessor's last binds are never handed out again.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from controller.extender.bind import AlwaysSole, Binder
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import Settings
from gpuwarden.errors import KubeError, KubeForbidden, KubeUnreachable
from tests.unit.extender_support import FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)


class Lease:
    """A `SoleBinder` a test steers: fenced or not, and the resourceVersion that made it leader."""

    def __init__(self, fenced: bool = True, acquired_rv: str = "") -> None:
        self.is_fenced = fenced
        self.acquired_rv = acquired_rv

    def fenced(self) -> bool:
        return self.is_fenced


def args(name: str, target: str = "n") -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node=target)


def binder(api: FakePodApi, lease: Any, *, watch: bool, **kw: Any) -> Binder:
    m = model([node("n")], api.pods.values())
    b = Binder(api, m, lambda: SETTINGS, clock=lambda: NOW, sole=lease, **kw)
    if watch:

        def applied(obj: dict[str, Any]) -> None:  # the feed: apply the event, then tell bind
            m.upsert_pod(obj)
            b.pod_seen(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")

        api.on_write.append(applied)
    return b


async def test_the_binder_writes_the_set_on_the_binding_itself_one_write() -> None:
    api = FakePodApi([pod("p", 4)])
    outcome = await binder(api, AlwaysSole(), watch=True).bind(args("p"))
    assert outcome.kind == "bound" and outcome.choice is not None and outcome.policy == "single-numa"
    assert api.calls == ["bind ml/p n +annotations"]  # from the watch cache: no GET, no PATCH, no LIST
    meta = api.pods["ml/p"]["metadata"]
    assert meta["annotations"]["gpuwarden.io/gpu-ids"] == "0,1,2,3"
    assert meta["annotations"]["gpuwarden.io/numa-node"] == "0"
    assert meta["annotations"]["gpuwarden.io/gpu-node"] == "n"
    assert meta["annotations"]["gpuwarden.io/gpu-claimed-at"] == f"{NOW:.3f}"
    assert "gpuwarden.io/gpu-node" not in meta["labels"]  # a Binding carries no labels


@pytest.mark.parametrize("when", ["before", "during"])
async def test_not_fenced_writes_nothing(when: str) -> None:
    api = FakePodApi([pod("p", 2), pod("old", 2, node="n", ids="0,1", resource_version="5000")])
    lease = Lease(fenced=when == "during", acquired_rv="999999")  # not caught up: bind LISTs first
    b = binder(api, lease, watch=False)
    if when == "during":

        async def fence_ends(obj: dict[str, Any]) -> None:  # never called: nothing may be written
            raise AssertionError(f"wrote {obj['metadata']['name']}")

        api.on_write.append(fence_ends)
        original = api.list_node_pods

        async def slow_list(target: str) -> list[dict[str, Any]]:
            lease.is_fenced = False  # the fence ends while the consistent read is under way
            return await original(target)

        api.list_node_pods = slow_list  # type: ignore[method-assign]
    outcome = await b.bind(args("p"))
    assert (outcome.kind, outcome.cause) == ("error", "not_binder")
    assert "the binder" in outcome.error and "retry" in outcome.error
    assert not [c for c in api.calls if c.startswith(("patch", "bind"))]
    assert not b.has_inflight()


async def test_concurrent_binds_in_the_binder_never_overlap_before_the_watch_shows_any() -> None:
    api = FakePodApi([pod("a", 4), pod("b", 2), pod("c", 2)])
    api.jitter = random.Random(3)
    b = binder(api, AlwaysSole(), watch=False)
    outcomes = await asyncio.gather(*(b.bind(args(n)) for n in "abc"))
    assert [o.kind for o in outcomes] == ["bound"] * 3
    assert api.held() == Counter({str(i): 1 for i in range(8)})


async def test_a_new_binder_chooses_from_a_consistent_read_until_its_watch_passes_the_takeover() -> None:
    api = FakePodApi([pod("a", 4), pod("b", 4), pod("c", 1)])
    lease = Lease(fenced=False)
    stale = binder(api, lease, watch=False)  # built before the predecessor's last bind
    previous = binder(api, AlwaysSole(), watch=False)
    assert (await previous.bind(args("a"))).kind == "bound"  # GPUs 0-3, unseen by `stale`
    # the Lease write that made `stale` the binder comes after the predecessor's last bind
    lease.is_fenced, lease.acquired_rv = True, str(api.revision)
    outcome = await stale.bind(args("b"))
    assert outcome.choice is not None and outcome.choice.ids == ("4", "5", "6", "7")
    assert api.calls[-3:] == [
        "list spec.nodeName=n",
        "list gpuwarden.io/gpu-node=n",
        "bind ml/b n +annotations",
    ]
    assert api.held() == Counter({str(i): 1 for i in range(8)})


async def test_the_binder_stops_listing_once_its_watch_delivered_a_write_after_the_takeover() -> None:
    api = FakePodApi([pod("a", 1), pod("b", 1), pod("c", 1)])
    lease = Lease(acquired_rv=str(api.revision))
    b = binder(api, lease, watch=True)
    await b.bind(args("a"))  # LISTs; its own Binding comes back through the watch, past the takeover
    api.calls.clear()
    await b.bind(args("b"))
    assert api.calls == ["bind ml/b n +annotations"]
    lease.acquired_rv = str(api.revision + 10)  # led again later: LIST again until the watch passes that
    api.calls.clear()
    await b.bind(args("c"))
    assert api.calls[0] == "list spec.nodeName=n"


async def test_a_resource_version_that_is_not_a_number_never_counts_as_caught_up() -> None:
    api = FakePodApi([pod("a", 1), pod("b", 1)])
    b = binder(api, Lease(acquired_rv="opaque-token"), watch=True)
    await b.bind(args("a"))
    api.calls.clear()
    await b.bind(args("b"))
    assert api.calls[0] == "list spec.nodeName=n"


async def test_a_reservation_is_bound_with_its_own_set_unless_another_pod_holds_it() -> None:
    reserved = pod("p", 2, ids="6,7", claim=("n", NOW - 2))
    api = FakePodApi([reserved])
    outcome = await binder(api, AlwaysSole(), watch=True).bind(args("p"))
    assert outcome.kind == "bound" and outcome.choice is not None and outcome.choice.ids == ("6", "7")
    assert api.calls == ["get ml/p", "bind ml/p n +annotations"]

    taken = FakePodApi([pod("q", 2, ids="6,7", claim=("n", NOW - 2)), pod("r", 2, node="n", ids="6,7")])
    outcome = await binder(taken, AlwaysSole(), watch=True).bind(args("q"))
    assert (outcome.kind, outcome.cause) == ("conflict", "gpu_claimed")
    assert "GPU 6,7 by ml/r" in outcome.error
    assert not [c for c in taken.calls if c.startswith("bind")]


async def test_a_concurrent_try_of_the_same_pod_binds_it_once() -> None:
    api = FakePodApi([pod("p", 2)])
    api.jitter = random.Random(5)
    b = binder(api, AlwaysSole(), watch=False)
    outcomes = await asyncio.gather(b.bind(args("p")), b.bind(args("p")))
    assert sorted(o.kind for o in outcomes) in (["already_bound", "bound"], ["bound", "bound"])
    assert sum(api.held().values()) == 2


async def test_preemption_victims_still_in_the_cache_are_checked_with_a_consistent_read() -> None:
    victim = pod("v", 8, node="n", ids="0,1,2,3,4,5,6,7")
    api = FakePodApi([victim, pod("p", 8)])
    b = binder(api, AlwaysSole(), watch=False)
    del api.pods["ml/v"]  # deleted; the cache has not seen it go
    outcome = await b.bind(args("p"))
    assert outcome.kind == "bound"
    assert api.calls[:2] == ["list spec.nodeName=n", "list gpuwarden.io/gpu-node=n"]


@pytest.mark.parametrize("seed", range(20))
async def test_binds_across_a_handover_never_assign_a_gpu_twice(seed: int) -> None:
    pods = [pod(f"p{i}", k) for i, k in enumerate((4, 2, 2, 1, 1, 4, 8, 1))]
    api = FakePodApi(pods)
    api.jitter = random.Random(seed)
    first = binder(api, AlwaysSole(), watch=False)
    second_lease = Lease(fenced=False)
    second = binder(api, second_lease, watch=False)  # a stale cache: never sees first's binds
    order = random.Random(seed).sample(range(len(pods)), len(pods))
    half = len(order) // 2
    await asyncio.gather(*(first.bind(args(f"p{i}")) for i in order[:half]))
    second_lease.is_fenced, second_lease.acquired_rv = True, str(api.revision)  # first is gone, second leads
    await asyncio.gather(*(second.bind(args(f"p{i}")) for i in order[half:]))
    counts = api.held()
    assert all(c == 1 for c in counts.values()), counts


@pytest.mark.parametrize(
    ("error", "kept"),
    [
        (KubeError("admission webhook denied the request", status=400), False),
        (KubeForbidden("forbidden", status=403), False),
        (KubeUnreachable("connection reset"), True),
        (KubeError("etcdserver: request timed out", status=500), True),
    ],
    ids=["refused-400", "refused-403", "unreachable", "server-error"],
)
async def test_a_binding_whose_outcome_is_unknown_keeps_its_gpus_in_flight(
    error: Exception, kept: bool
) -> None:
    api = FakePodApi([pod("p", 4), pod("q", 4)])
    b = binder(api, AlwaysSole(), watch=False)
    api.fail_binding = error
    outcome = await b.bind(args("p"))
    assert outcome.kind == "error" and outcome.cause == "api_error"
    assert [c.ids for c in b.overlay("n")] == ([("0", "1", "2", "3")] if kept else [])
    api.fail_binding = None
    second = await b.bind(args("q"))  # may have landed: q never gets p's GPUs while that is unknown
    assert second.choice is not None and second.choice.ids == (
        ("4", "5", "6", "7") if kept else ("0", "1", "2", "3")
    )
