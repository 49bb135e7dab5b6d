"""Bind verifying its claim from the pod watch instead of a LIST: same guarantee, one API call fewer.

A replica's watch is played by `OrderedWatch`: every write of the fake API server, in write order, applied
to that replica's model after a random number of event-loop turns (a lagging watch, never a reordered one,
which is what the API server guarantees). The property under test is the protocol's: of two overlapping
claims the later one sees the earlier one, so no GPU is ever bound twice.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from controller.extender.bind import Binder
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from tests.unit.extender_support import FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)


def args(name: str, target: str = "n") -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node=target)


class OrderedWatch:
    """One replica's pod watch: the API server's writes in order, each after 0..`lag` loop turns."""

    def __init__(self, api: FakePodApi, rng: random.Random | None = None, lag: int = 5) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.rng, self.lag = rng or random.Random(0), lag
        self.binder: Binder | None = None
        self.model: ClusterModel | None = None
        api.on_write.append(self.queue.put_nowait)
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            obj = await self.queue.get()
            for _ in range(self.rng.randint(0, self.lag)):
                await asyncio.sleep(0)
            assert self.model is not None and self.binder is not None
            self.model.upsert_pod(obj)
            self.binder.pod_seen(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")


def replica(api: FakePodApi, watch: OrderedWatch | None, **kw: Any) -> Binder:
    m = model([node("n")], api.pods.values())
    binder = Binder(api, m, lambda: SETTINGS, clock=lambda: NOW, **kw)
    if watch is not None:
        watch.model, watch.binder = m, binder
    return binder


async def test_claim_seen_on_the_watch_needs_no_list() -> None:
    api = FakePodApi([pod("p", 4)])
    watch = OrderedWatch(api)
    kinds: list[str] = []
    outcome = await replica(api, watch, watch_timeout=5.0, on_conflict=kinds.append).bind(args("p"))
    watch.task.cancel()
    assert outcome.kind == "bound" and outcome.choice is not None
    assert api.calls == ["patch ml/p", "bind ml/p n"]
    assert kinds == []


async def test_watch_that_never_shows_the_claim_falls_back_to_a_consistent_list() -> None:
    api = FakePodApi([pod("p", 4)])
    kinds: list[str] = []
    outcome = await replica(api, None, watch_timeout=0.02, on_conflict=kinds.append).bind(args("p"))
    assert outcome.kind == "bound"
    assert api.calls == ["patch ml/p", "list gpuwarden.io/gpu-node=n", "bind ml/p n"]
    assert kinds == ["watch_lag"]


async def test_zero_timeout_always_lists() -> None:
    api = FakePodApi([pod("p", 2)])
    watch = OrderedWatch(api)
    outcome = await replica(api, watch, watch_timeout=0.0).bind(args("p"))
    watch.task.cancel()
    assert outcome.kind == "bound"
    assert api.calls == ["patch ml/p", "list gpuwarden.io/gpu-node=n", "bind ml/p n"]


async def test_later_claim_sees_the_earlier_one_through_its_watch() -> None:
    # replica 2 claims GPUs replica 1 claimed a moment earlier; its cache had not seen that claim when it
    # chose, but by the time its watch shows its own claim it shows the earlier one too
    api = FakePodApi([pod("a", 4), pod("b", 4)])
    w1, w2 = OrderedWatch(api, lag=0), OrderedWatch(api, lag=0)
    first = replica(api, w1, watch_timeout=5.0)
    second = replica(api, w2, watch_timeout=5.0)
    results = await asyncio.gather(first.bind(args("a")), second.bind(args("b")))
    w1.task.cancel()
    w2.task.cancel()
    kinds = sorted((r.kind, r.cause) for r in results)
    # both chose GPUs 0-3 from the same empty view. The later claim always sees the earlier one, so at most
    # one binds; the earlier may see the later too (then neither binds: both are withdrawn and retried, as
    # with a LIST). Never both.
    assert kinds in ([("bound", ""), ("conflict", "gpu_claimed")], [("conflict", "gpu_claimed")] * 2), kinds
    assert all(c == 1 for c in api.held().values())
    assert not [c for c in api.calls if c.startswith("list")]
    for key in ("ml/a", "ml/b"):  # a losing claim is withdrawn
        obj = api.pods[key]
        assert obj["spec"].get("nodeName") or "gpuwarden.io/gpu-ids" not in obj["metadata"]["annotations"]


@pytest.mark.parametrize("seed", range(40))
async def test_two_replicas_with_lagging_watches_never_assign_a_gpu_twice(seed: int) -> None:
    sizes = (4, 2, 2, 1, 1, 4, 8, 1, 2, 1)
    api = FakePodApi([pod(f"p{i}", k) for i, k in enumerate(sizes)])
    api.jitter = random.Random(seed)
    watches = [OrderedWatch(api, random.Random(seed * 7 + r), lag=8) for r in range(2)]
    kinds: list[str] = []
    replicas = [replica(api, w, watch_timeout=5.0, on_conflict=kinds.append) for w in watches]
    rng = random.Random(seed)
    for _ in range(4):  # the scheduler retries failed binds; each round both replicas bind concurrently
        pending = [i for i in range(len(sizes)) if not api.pods[f"ml/p{i}"]["spec"].get("nodeName")]
        await asyncio.gather(
            *(replicas[rng.randrange(2)].bind(args(f"p{i}")) for i in rng.sample(pending, len(pending)))
        )
        await asyncio.sleep(0.01)  # let the watches catch up, as between scheduler retries
        counts = api.held()
        assert all(c == 1 for c in counts.values()), counts
    for w in watches:
        w.task.cancel()
    assert 0 < sum(counts.values()) <= 8
    assert (
        "watch_lag" not in kinds
    )  # every claim was verified from the watch (LISTs: choosing on a full node)


async def test_reused_claim_already_in_the_cache_is_verified_without_waiting_or_listing() -> None:
    claimed = pod("p", 2, ids="6,7", claim=("n", NOW - 2))
    api = FakePodApi([claimed])
    watch = OrderedWatch(api)
    outcome = await replica(api, watch, watch_timeout=5.0).bind(args("p"))
    watch.task.cancel()
    assert outcome.kind == "bound" and outcome.choice is not None and outcome.choice.ids == ("6", "7")
    assert api.calls == ["get ml/p", "bind ml/p n"]  # a live read (reuse writes nothing), no LIST
