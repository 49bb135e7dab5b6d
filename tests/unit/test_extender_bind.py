"""Bind: claim before Binding, idempotency, and no GPU assigned twice under concurrent binds and replicas.

Replicas are separate `Binder`s with separate models sharing one fake API server; "stale" means the watch
never delivered the other replica's writes, the worst case for the claim protocol.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from controller.extender.bind import Binder, BindOutcome
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from gpuwarden.errors import KubeError
from tests.unit.extender_support import FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)


def args(name: str, target: str = "n", uid: str | None = None) -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=uid or f"uid-{name}", node=target)


def replica(api: FakePodApi, *, watch: bool, nodes: list[dict[str, Any]] | None = None, **kw: Any) -> Binder:
    m = model(nodes or [node("n")], api.pods.values())
    if watch:
        api.on_write.append(m.upsert_pod)
    return Binder(api, m, lambda: SETTINGS, clock=lambda: NOW, **kw)


async def test_bind_writes_claim_before_binding() -> None:
    api = FakePodApi([pod("p", 4)])
    outcome = await replica(api, watch=True).bind(args("p"))
    assert outcome == BindOutcome("bound", "", outcome.choice, policy="single-numa")
    assert outcome.choice is not None
    # the watch cache has the pod unbound with this UID: no GET, its resourceVersion guards the claim
    assert api.calls == ["patch ml/p", "list gpuwarden.io/gpu-node=n", "bind ml/p n"]
    meta = api.pods["ml/p"]["metadata"]
    assert meta["annotations"]["gpuwarden.io/gpu-ids"] == "0,1,2,3"
    assert meta["annotations"]["gpuwarden.io/numa-node"] == "0"
    assert meta["labels"]["gpuwarden.io/gpu-node"] == "n"


async def test_bind_reports_each_step_once_in_order() -> None:
    api, phases = FakePodApi([pod("p", 2)]), []
    binder = replica(api, watch=True, on_phase=lambda phase, seconds: phases.append((phase, seconds)))
    assert (await binder.bind(args("p"))).kind == "bound"
    assert [phase for phase, _ in phases] == ["claim", "verify", "binding"]
    assert all(seconds >= 0 for _, seconds in phases)


async def test_bind_reports_no_binding_step_when_it_does_not_bind() -> None:
    api, phases = FakePodApi([pod("p", 2)]), []
    api.fail_binding = KubeError("apiserver unavailable", status=503)
    binder = replica(api, watch=True, on_phase=lambda phase, seconds: phases.append((phase, seconds)))
    assert (await binder.bind(args("p"))).kind == "error"
    assert [phase for phase, _ in phases] == ["claim", "verify"]


@pytest.mark.parametrize(
    ("objects", "request_", "kind", "error", "cause"),
    [
        ([pod("p", 1)], args("p", uid="other"), "error", "pod ml/p has UID uid-p, not other", "pod_replaced"),
        ([pod("p", 1, node="m")], args("p"), "error", "pod ml/p is already bound to m", "bound_elsewhere"),
        ([pod("p", 1, node="n", ids="3")], args("p"), "already_bound", "", ""),
        ([], args("p"), "error", "pod ml/p not found", "pod_gone"),
        (
            [pod("p", 8, policy="single-pcie")],
            args("p"),
            "rejected",
            "no GPU set for ml/p on n: at most 2 healthy",
            "no_fit",
        ),
        ([pod("p", 2)], args("p", "unknown"), "rejected", "not (yet) known", "no_fit"),
    ],
    ids=[
        "uid-mismatch",
        "bound-elsewhere",
        "already-bound-here",
        "pod-gone",
        "no-fitting-set",
        "unknown-node",
    ],
)
async def test_bind_refusals(
    objects: list[dict[str, Any]], request_: ExtenderBindingArgs, kind: str, error: str, cause: str
) -> None:
    api = FakePodApi(objects)
    outcome = await replica(api, watch=True).bind(request_)
    assert (outcome.kind, outcome.cause) == (kind, cause)
    assert error in outcome.error if error else outcome.error == ""
    assert not [c for c in api.calls if c.startswith(("patch", "bind"))]


async def test_pod_without_gpus_is_bound_without_annotations() -> None:
    api = FakePodApi([pod("web", 0)])
    assert (await replica(api, watch=True).bind(args("web"))).kind == "bound"
    assert api.calls == ["get ml/web", "bind ml/web n"]


async def test_same_replica_concurrent_binds_use_disjoint_sets_even_before_the_watch_catches_up() -> None:
    api = FakePodApi([pod("a", 4), pod("b", 4)])
    binder = replica(api, watch=False)
    outcomes = await asyncio.gather(binder.bind(args("a")), binder.bind(args("b")))
    assert [o.kind for o in outcomes] == ["bound", "bound"]
    assert api.held() == Counter({str(i): 1 for i in range(8)})


async def test_second_replica_with_stale_cache_loses_the_race_cleanly() -> None:
    api = FakePodApi([pod("a", 4), pod("b", 4)])
    first, second = replica(api, watch=False), replica(api, watch=False)
    results: list[BindOutcome] = []

    async def second_binds_during_first_claim(obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "a" and not results:
            results.append(await second.bind(args("b")))

    api.on_write.append(second_binds_during_first_claim)
    first_outcome = await first.bind(args("a"))
    assert first_outcome.kind == "bound"
    assert (results[0].kind, results[0].cause) == ("conflict", "gpu_claimed")
    assert "claimed concurrently (GPU 0,1,2,3 by ml/a)" in results[0].error
    assert "gpuwarden.io/gpu-ids" not in api.pods["ml/b"]["metadata"]["annotations"]  # claim withdrawn
    assert api.held() == Counter({"0": 1, "1": 1, "2": 1, "3": 1})


@pytest.mark.parametrize("seed", range(25))
async def test_two_stale_replicas_never_assign_a_gpu_twice(seed: int) -> None:
    pods = [pod(f"p{i}", k) for i, k in enumerate((4, 2, 2, 1, 1, 4, 8, 1))]
    api = FakePodApi(pods)
    api.jitter = random.Random(seed)
    replicas = [replica(api, watch=False), replica(api, watch=False)]
    order = random.Random(seed).sample(range(len(pods)), len(pods))
    await asyncio.gather(*(replicas[i % 2].bind(args(f"p{i}")) for i in order))
    counts = api.held()
    assert all(c == 1 for c in counts.values()), counts
    assert sum(counts.values()) <= 8


async def test_concurrent_retries_of_the_same_pod_bind_it_once() -> None:
    api = FakePodApi([pod("p", 2)])
    api.jitter = random.Random(7)
    first, second = replica(api, watch=False), replica(api, watch=False)
    outcomes = await asyncio.gather(first.bind(args("p")), second.bind(args("p")))
    assert sorted(o.kind for o in outcomes) in (["already_bound", "bound"], ["bound", "bound"])
    assert all(not o.error for o in outcomes)
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n" and sum(api.held().values()) == 2


async def test_restart_rebuilds_assignments_from_the_api() -> None:
    api = FakePodApi([pod("a", 4), pod("b", 4)])
    assert (await replica(api, watch=True).bind(args("a"))).kind == "bound"
    restarted = replica(api, watch=True)  # fresh model listed from the API server
    outcome = await restarted.bind(args("b"))
    assert outcome.choice is not None and outcome.choice.ids == ("4", "5", "6", "7")


async def test_failed_binding_withdraws_the_claim() -> None:
    api = FakePodApi([pod("p", 2)])
    api.fail_binding = KubeError("apiserver unavailable", status=503)
    outcome = await replica(api, watch=True).bind(args("p"))
    assert outcome.kind == "error" and outcome.error == "binding ml/p to n failed: apiserver unavailable"
    meta = api.pods["ml/p"]["metadata"]
    assert "gpuwarden.io/gpu-ids" not in meta["annotations"] and "gpuwarden.io/gpu-node" not in meta["labels"]


async def test_retry_after_timeout_reuses_its_own_claim() -> None:
    claimed = pod("p", 2, ids="6,7", claim=("n", NOW - 2))
    api = FakePodApi([claimed])
    outcome = await replica(api, watch=True).bind(args("p"))
    assert outcome.kind == "bound" and outcome.choice is not None and outcome.choice.ids == ("6", "7")
    assert outcome.choice.alignment == "nvlink"
    # a claim to reuse is never taken from the cache: reuse writes nothing, so it starts from a live read
    assert api.calls == ["get ml/p", "list gpuwarden.io/gpu-node=n", "bind ml/p n"]


async def test_expired_claim_of_another_pod_does_not_block() -> None:
    api = FakePodApi([pod("old", 4, ids="0,1,2,3", claim=("n", NOW - 3600)), pod("p", 8)])
    outcome = await replica(api, watch=True).bind(args("p"))
    assert outcome.kind == "bound" and sum(api.held().values()) == 8


async def test_pod_changing_during_bind_is_retried_then_given_up() -> None:
    api = FakePodApi([pod("p", 1)])
    conflicts: list[str] = []
    binder = replica(api, watch=False, on_conflict=conflicts.append, attempts=2)
    api.add(api.pods["ml/p"])  # written after the cache saw it: the cached try conflicts, then live reads

    original = FakePodApi.get_pod

    async def stale_get(namespace: str, name: str) -> dict[str, Any]:
        obj = await original(api, namespace, name)
        api.add(api.pods[f"{namespace}/{name}"])  # someone else writes the pod right after each read
        return obj

    api.get_pod = stale_get  # type: ignore[method-assign]
    outcome = await binder.bind(args("p"))
    # the stale-cache try costs no attempt: two live tries follow it
    assert outcome.kind == "conflict" and conflicts == ["pod_changed"] * 3
    assert api.calls == ["patch ml/p", "get ml/p", "patch ml/p", "get ml/p", "patch ml/p"]
    assert binder.overlay("n") == []


async def test_dry_run_binds_without_writing_a_claim() -> None:
    api = FakePodApi([pod("p", 2)])
    outcome = await replica(api, watch=True, dry_run=True).bind(args("p"))
    assert outcome.kind == "bound" and outcome.choice is not None
    assert api.calls == ["get ml/p", "bind ml/p n"]


async def test_dry_run_reports_what_a_real_run_would_refuse() -> None:
    """No fitting set in dry-run: decided from a consistent read as a real run would, then bound unclaimed
    with the refusal in `would_fail` (the verb turns it into a Warning Event)."""
    api = FakePodApi([pod("p", 8, policy="single-pcie")])
    outcome = await replica(api, watch=True, dry_run=True).bind(args("p"))
    assert outcome.kind == "bound" and outcome.choice is None and outcome.error == ""
    assert outcome.cause == "no_fit" and outcome.would_fail.startswith("no GPU set for ml/p on n: ")
    assert api.calls == ["get ml/p", "list gpuwarden.io/gpu-node=n", "bind ml/p n"]


async def test_overlay_forgets_claims_once_the_watch_shows_them() -> None:
    api = FakePodApi([pod("a", 2)])
    m = ClusterModel("nvidia.com/gpu")
    m.upsert_node(node("n"))
    m.nodes_synced = m.pods_synced = True
    binder = Binder(api, m, lambda: SETTINGS, clock=lambda: NOW)
    await binder.bind(args("a"))
    assert [c.pod for c in binder.overlay("n")] == ["ml/a"] and binder.has_inflight()
    m.upsert_pod(api.pods["ml/a"])
    assert binder.overlay("n") == []
    assert not binder.has_inflight()  # no empty per-node entries left behind to scan per request


async def test_failed_verification_read_withdraws_the_claim_and_does_not_bind() -> None:
    api = FakePodApi([pod("p", 2)])

    async def broken_list(label_selector: str) -> list[dict[str, Any]]:
        raise KubeError("etcd timeout", status=504)

    api.list_pods = broken_list  # type: ignore[method-assign]
    outcome = await replica(api, watch=True).bind(args("p"))
    assert outcome.kind == "error" and "etcd timeout" in outcome.error
    assert "gpuwarden.io/gpu-ids" not in api.pods["ml/p"]["metadata"]["annotations"]
    assert not api.pods["ml/p"]["spec"].get("nodeName")


def victim(name: str, ids: str, **kw: Any) -> dict[str, Any]:
    """A pod bound to "n" through our bind (so it carries the claim label a LIST by node finds)."""
    obj = pod(name, len(ids.split(",")), node="n", ids=ids, **kw)
    obj["metadata"]["labels"]["gpuwarden.io/gpu-node"] = "n"
    return obj


async def test_preemptor_binds_from_a_fresh_list_when_the_cache_still_shows_its_victims() -> None:
    # the scheduler saw the victims go and calls bind; our watch has not delivered their deletion yet
    victims = [victim("v1", "0,1,2,3", priority=0), victim("v2", "4,5,6,7", priority=0, deleting=True)]
    api = FakePodApi([pod("p", 8, priority=10, nominated="n"), *victims])
    kinds: list[str] = []
    binder = replica(api, watch=False, on_conflict=kinds.append)
    del api.pods["ml/v1"], api.pods["ml/v2"]
    outcome = await binder.bind(args("p"))
    assert outcome.kind == "bound", outcome.error
    assert outcome.choice is not None and outcome.choice.ids == tuple(str(i) for i in range(8))
    listed = "list gpuwarden.io/gpu-node=n"
    assert api.calls == [listed, "patch ml/p", listed, "bind ml/p n"]  # pod from the cache: no GET
    assert kinds == ["cache_stale"]


async def test_preemptor_bind_never_takes_gpus_of_a_pod_that_is_still_there() -> None:
    # filter lets a nominated pod count lower-priority holders as free; bind must not: "keep" was reprieved
    api = FakePodApi([pod("p", 4, priority=10, nominated="n"), victim("keep", "0,1,2,3", priority=0)])
    outcome = await replica(api, watch=False).bind(args("p"))
    assert outcome.kind == "bound" and outcome.choice is not None
    assert outcome.choice.ids == ("4", "5", "6", "7")
    assert api.held() == Counter({str(i): 1 for i in range(8)})


async def test_preemptor_still_blocked_in_a_fresh_list_is_rejected() -> None:
    api = FakePodApi([pod("p", 8, priority=10, nominated="n"), victim("hi", "0,1,2,3", priority=10)])
    outcome = await replica(api, watch=False).bind(args("p"))
    assert outcome.kind == "rejected" and "no GPU set for ml/p on n" in outcome.error
    assert "gpuwarden.io/gpu-ids" not in api.pods["ml/p"]["metadata"]["annotations"]


async def test_bind_reserves_its_set_for_filter_and_prioritize_before_any_api_call() -> None:
    # the scheduler has assumed "p" on n and scores the next pod while this bind is still in flight;
    # the pod comes from the cache, so the claim patch is the first API call
    api = FakePodApi([pod("p", 4)])
    binder = replica(api, watch=False)
    seen: list[list[tuple[str, tuple[str, ...]]]] = []
    patch = api.patch_pod

    async def patch_pod(namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        seen.append([(c.pod, c.ids) for c in binder.overlay("n")])
        return await patch(namespace, name, body)

    api.patch_pod = patch_pod  # type: ignore[method-assign]
    assert (await binder.bind(args("p"))).kind == "bound"
    assert seen == [[("ml/p", ("0", "1", "2", "3"))]]


async def test_reservation_is_dropped_when_the_bind_fails() -> None:
    api = FakePodApi([pod("p", 4)])
    binder = replica(api, watch=False)
    api.fail_binding = KubeError("apiserver down", status=503)
    assert (await binder.bind(args("p"))).kind == "error"
    assert binder.overlay("n") == []


async def test_overlay_drops_the_claim_of_a_pod_deleted_before_the_watch_showed_the_claim() -> None:
    # a preemption victim bound by this replica and deleted at once: its claim must not pin GPUs for the TTL
    api = FakePodApi([pod("v", 4)])
    binder = replica(api, watch=False)
    assert (await binder.bind(args("v"))).kind == "bound"
    assert [c.pod for c in binder.overlay("n")] == ["ml/v"]
    binder._model.delete_pod("ml/v")  # the watch delivers the deletion, never having shown the claim
    assert binder.overlay("n") == []
