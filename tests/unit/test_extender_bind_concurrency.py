"""Bind under concurrency: binds to one node overlap their round trips yet never pick overlapping GPUs, and
the pod is taken from the watch cache (no GET) with a live read only when the cache turns out stale.

The fake API server yields to the event loop on every call, as a real round trip does, so the binds of one
`asyncio.gather` run side by side; the replica's watch never delivers its own writes (worst case for the
in-flight claims)."""

from __future__ import annotations

import asyncio

from controller.extender.bind import Binder, BindOutcome
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import Settings
from tests.unit.extender_support import FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)
LISTED = "list gpuwarden.io/gpu-node=n"


class YieldingPodApi(FakePodApi):
    """Every call yields once before it is served, like a round trip to a real API server."""

    async def _yield(self) -> None:
        await asyncio.sleep(0)


def args(name: str) -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node="n")


def replica(api: FakePodApi, conflicts: list[str], *, cached: bool = True) -> Binder:
    m = model([node("n")], api.pods.values() if cached else ())
    return Binder(api, m, lambda: SETTINGS, clock=lambda: NOW, on_conflict=conflicts.append)


def ids_of(outcome: BindOutcome) -> set[str]:
    assert outcome.choice is not None, outcome
    return set(outcome.choice.ids)


async def test_concurrent_binds_to_one_node_overlap_their_calls_and_pick_disjoint_sets() -> None:
    names = ["a", "b", "c", "d"]
    api = YieldingPodApi([pod(n, 2) for n in names])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    outcomes = await asyncio.gather(*(binder.bind(args(n)) for n in names))
    assert [o.kind for o in outcomes] == ["bound"] * 4 and conflicts == []
    sets = [ids_of(o) for o in outcomes]
    assert set().union(*sets) == {str(i) for i in range(8)}  # 4 x 2 GPUs, none twice
    # no lock held across a round trip: another bind's claim patch comes between a bind's patch and its
    # verification LIST (serialised per node, every patch would be followed by its own LIST)
    claim_calls = [c for c in api.calls if c.startswith(("patch", "list"))]
    serialised = all(claim_calls[i + 1] == LISTED for i, c in enumerate(claim_calls) if c.startswith("patch"))
    assert not serialised, claim_calls
    assert claim_calls[:2] == ["patch ml/a", "patch ml/b"]
    assert not [c for c in api.calls if c.startswith("get")]


async def test_in_flight_claim_hides_an_expired_claim_of_the_same_pod_from_the_next_chooser() -> None:
    # "a" was claimed on GPUs 0,1 long ago and picks 0,1 again: its in-flight claim must count for "b"
    # although the cache shows an (expired) claim of "a" - neither overriding that claim in the view nor
    # taking it for the in-flight one as already delivered by the watch (both would let "b" pick 0,1)
    api = YieldingPodApi([pod("a", 2, ids="0,1", claim=("n", NOW - 3600)), pod("b", 2)])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    first, second = await asyncio.gather(binder.bind(args("a")), binder.bind(args("b")))
    assert (first.kind, second.kind, conflicts) == ("bound", "bound", [])
    assert not ids_of(first) & ids_of(second)


async def test_stale_cache_conflict_falls_back_to_a_live_read() -> None:
    api = FakePodApi([pod("p", 2)])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    api.add(api.pods["ml/p"])  # e.g. the scheduler updated its status; the watch has not delivered it
    outcome = await binder.bind(args("p"))
    assert outcome.kind == "bound" and conflicts == ["pod_changed"]
    assert api.calls == ["patch ml/p", "get ml/p", "patch ml/p", LISTED, "bind ml/p n"]
    assert [c.pod for c in binder.overlay("n")] == ["ml/p"]  # the written claim, until the watch shows it


async def test_pod_bound_meanwhile_is_already_bound_and_keeps_no_claim() -> None:
    api = FakePodApi([pod("p", 2)])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    api.add(pod("p", 2, node="n", ids="4,5"))  # another replica bound it; our cache still shows it pending
    outcome = await binder.bind(args("p"))
    assert outcome.kind == "already_bound" and api.calls == ["patch ml/p", "get ml/p"]
    assert binder.overlay("n") == []


async def test_pod_deleted_meanwhile_is_gone_and_keeps_no_claim() -> None:
    api = FakePodApi([pod("p", 2)])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    del api.pods["ml/p"]
    outcome = await binder.bind(args("p"))
    assert (outcome.kind, outcome.cause) == ("error", "pod_gone") and api.calls == ["patch ml/p"]
    assert binder.overlay("n") == []


async def test_pod_missing_from_the_cache_is_read_live() -> None:
    api = FakePodApi([pod("p", 2)])
    conflicts: list[str] = []
    outcome = await replica(api, conflicts, cached=False).bind(args("p"))
    assert outcome.kind == "bound" and conflicts == []
    assert api.calls == ["get ml/p", "patch ml/p", LISTED, "bind ml/p n"]


async def test_pod_cached_with_another_uid_is_read_live() -> None:
    api = FakePodApi([pod("p", 2, uid="old")])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    api.add(pod("p", 2))  # deleted and recreated: the scheduler binds the new UID
    outcome = await binder.bind(args("p"))
    assert outcome.kind == "bound" and api.calls[0] == "get ml/p"


async def test_concurrent_retry_of_the_same_pod_keeps_the_written_claim_in_flight() -> None:
    # the scheduler retried a bind that timed out on its side while the first is still running
    api = YieldingPodApi([pod("p", 2)])
    conflicts: list[str] = []
    binder = replica(api, conflicts)
    outcomes = await asyncio.gather(binder.bind(args("p")), binder.bind(args("p")))
    assert sorted(o.kind for o in outcomes) == ["already_bound", "bound"]
    written = api.pods["ml/p"]["metadata"]["annotations"]["gpuwarden.io/gpu-ids"]
    # the loser's conflict did not take the winner's claim out of the overlay before the watch shows it
    assert [(c.pod, ",".join(c.ids)) for c in binder.overlay("n")] == [("ml/p", written)]
