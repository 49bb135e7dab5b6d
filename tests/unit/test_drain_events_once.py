"""The drain's GPUDrainBlocked and GPUDrainGateClosed Events exist once across leaders (named Events).

GPUDrainBlocked is named after the pod (name, uid) and the drain's start, which is stored before any
Eviction is sent: a leader killed after the refusal but before the state that records it lets the next
leader's retry answer 409. GPUDrainGateClosed is named after the held quarantine's start: one per
quarantine however many passes and leaders hold it (and this process does not re-create it every pass).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.drain.loop import DrainLoop
from controller.drain.state import decode
from gpuwarden.errors import KubeError
from gpuwarden.kube.resources import JsonObject, Resource
from gpuwarden.wellknown import DRAIN, DRAIN_PAUSE
from tests.unit.test_drain_cancel_crash import CONFIG, Cache
from tests.unit.test_drain_crash import NOW, Api, Killed


class GuardedApi(Api):
    """Pod `a` is guarded by a PodDisruptionBudget: its Eviction is answered 429 (nothing written)."""

    def __init__(self, kill_before: int | None) -> None:
        super().__init__(kill_before)
        for name in ("b", "c"):
            del self.pods[name]
        self.creates = 0

    async def request(self, method: str, path: str, **kw: Any) -> JsonObject:
        if path.split("/")[-2] == "a":
            raise KubeError("Cannot evict pod as it would violate the pod's disruption budget.", status=429)
        return await super().request(method, path, **kw)

    async def create(self, resource: Resource, body: JsonObject, **kw: Any) -> JsonObject:
        self.creates += 1
        return await super().create(resource, body, **kw)


def new_leader(api: Api) -> DrainLoop:
    return DrainLoop(
        CONFIG, api,  # type: ignore[arg-type]
        pods=Cache(api.pods), nodes=Cache(api.nodes), clock=lambda: api.now, instance="leader",  # type: ignore[arg-type]
    )  # fmt: skip


def reasons(api: Api) -> list[str]:
    return sorted(e["reason"] for e in api.events)


BLOCKED_WRITES = ["GPUDrainStarted", "ledger(a)", "GPUDrainBlocked", "state(history)"]


@pytest.mark.parametrize("k", range(len(BLOCKED_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_blocked_evented_once_across_leaders(k: int) -> None:
    api = GuardedApi(kill_before=k)
    try:
        asyncio.run(new_leader(api).run_once())
        killed = False
    except Killed:
        killed = True
    assert killed == (k < len(BLOCKED_WRITES)) and api.writes == k
    api.kill_before = None
    for step in range(1, 5):  # new leaders, each retrying the refused eviction when its back-off allows
        api.now = NOW + 8 + 130 * step
        asyncio.run(new_leader(api).run_once())
    assert reasons(api) == ["GPUDrainBlocked", "GPUDrainStarted"]
    state, _ = decode(api.nodes["n1"]["metadata"]["annotations"][DRAIN])
    assert state is not None and state.history["ml/a"].attempts >= 4, "refused again and again, evented once"


def test_gate_closed_once_per_quarantine_and_not_recreated_each_pass() -> None:
    api = GuardedApi(kill_before=None)
    api.nodes["n1"]["metadata"]["annotations"][DRAIN_PAUSE] = "true"
    leader = new_leader(api)
    for _ in range(3):
        asyncio.run(leader.run_once())
    assert reasons(api) == ["GPUDrainGateClosed"]
    assert api.creates == 1, "this process knows the Event exists"
    asyncio.run(new_leader(api).run_once())  # the next leader: one create, answered 409
    assert reasons(api) == ["GPUDrainGateClosed"] and api.creates == 2
