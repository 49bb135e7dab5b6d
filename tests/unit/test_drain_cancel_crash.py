"""A drain cancelled by a release, with the leader killed between any two writes: the cancel is announced
once, the GPUPodEvicted Events the drain still owed are written once, and the last minute's evictions keep
counting against the fleet's evictions-per-minute limit until the minute has passed.

The cancel writes (cancel.py): (1) GPUDrainCancelled, named after the drain's start, (2) the owed
GPUPodEvicted Event (named after the pod's uid), (3) the cancelled state: the ledger only. Each row kills the
leader before write k+1 (the real `DrainLoop` pass against the in-memory API of test_drain_crash); a new
leader with no memory then runs passes from what the API holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.drain.cancel import after_cancel, plan_cancel
from controller.drain.loop import DrainLoop
from controller.drain.observe import build_snapshot
from controller.drain.plan import DrainPod, Eviction, evictions_in_window
from controller.drain.state import DrainState, decode
from gpuwarden.config.root import Config
from gpuwarden.kube.resources import JsonObject
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN, QUARANTINE_RECORD, QUARANTINE_TAINT
from tests.unit.test_drain_crash import GPU, NOW, Api, Killed, node, pod

CONFIG = Config.model_validate(
    {"drain": {"enabled": True, "gate": {"max_evictions_per_minute": 2, "min_schedulable_percent": 0}}}
)
TAINT = {"key": QUARANTINE_TAINT, "value": "gpu-missing", "effect": "NoSchedule"}


class Cache:
    """The loop's watch cache of one kind, over the API's objects."""

    def __init__(self, objects: dict[str, JsonObject]) -> None:
        self._objects = objects
        self.synced = asyncio.Event()
        self.synced.set()

    def objects(self) -> list[JsonObject]:
        return list(self._objects.values())

    def get(self, key: str) -> JsonObject | None:
        return self._objects.get(key)


def released_mid_drain() -> Api:
    """n1 was drained and released: `a` evicted 20 s ago (evented), `b` evicted 10 s ago by a leader that
    died before its Event (terminating), `c` still running. n2 is quarantined, its pods `d` and `e` wait."""
    api = Api(kill_before=None)
    ledger = (Eviction("ml/a", "uid-a", NOW - 20, evented=True), Eviction("ml/b", "uid-b", NOW - 10))
    state = DrainState(started=NOW - 30, pending=("ml/c",), evictions=ledger)
    api.nodes["n1"] = node("n1", {DRAIN: state.encode()}, [])
    del api.pods["a"]
    api.pods["b"]["metadata"]["deletionTimestamp"] = "2023-11-14T22:13:10Z"
    rec = QuarantineRecord(
        "quarantined", "gpu-missing", evidence=(Evidence("gpu-missing"),), quarantined_at=NOW
    )
    api.nodes["n2"] = node("n2", {QUARANTINE_RECORD: rec.encode()}, [TAINT])
    for name in ("d", "e"):
        api.pods[name] = pod(name)
        api.pods[name]["spec"]["nodeName"] = "n2"
    return api


def leader_pass(api: Api) -> None:
    """One pass of a new leader (no memory): the real DrainLoop over the API's objects."""
    loop = DrainLoop(
        CONFIG, api,  # type: ignore[arg-type]
        pods=Cache(api.pods), nodes=Cache(api.nodes), clock=lambda: api.now, instance="leader",  # type: ignore[arg-type]
    )  # fmt: skip
    asyncio.run(loop.run_once())


def state_of(api: Api, name: str) -> DrainState | None:
    return decode(api.nodes[name]["metadata"]["annotations"].get(DRAIN))[0]


def event_reasons(api: Api, regarding: str) -> list[str]:
    return sorted(e["reason"] for e in api.events if e["regarding"]["name"] == regarding)


CANCEL_WRITES = ["GPUDrainCancelled", "GPUPodEvicted(b)", "cancelled-state"]


@pytest.mark.parametrize("k", range(len(CANCEL_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_cancel_killed_between_writes(k: int) -> None:
    api = released_mid_drain()
    api.nodes["n2"]["spec"]["taints"] = []  # n2 not quarantined: the pass only cancels n1's drain
    api.kill_before = k
    try:
        leader_pass(api)
        killed = False
    except Killed:
        killed = True
    assert killed == (k < len(CANCEL_WRITES)) and api.writes == k
    api.kill_before = None
    api.now = NOW + 8  # the next leader, one lease later
    leader_pass(api)

    assert event_reasons(api, "n1") == ["GPUDrainCancelled"]
    assert event_reasons(api, "b") == ["GPUPodEvicted"], "the owed Event written once"
    state = state_of(api, "n1")
    assert state is not None and state.cancelled is not None
    assert (state.pending, dict(state.blocked), state.done) == ((), {}, None)
    assert [(e.pod, e.evented) for e in state.evictions] == [("ml/a", True), ("ml/b", True)]
    snap = build_snapshot(api.nodes.values(), api.pods.values(), resource=GPU)
    assert evictions_in_window(snap.ledgers(), api.now) == 2, "the cancelled drain's evictions still count"
    writes = api.writes
    leader_pass(api)
    assert api.writes == writes, "a finished cancel needs no further writes"


def test_a_cancelled_drains_evictions_hold_the_fleet_limit_then_the_state_goes() -> None:
    """n1's drain (2 evictions in the last minute) is cancelled; n2's drain starts: with a limit of 2 per
    minute, nothing of n2 is evicted until n1's evictions are a minute old; then n1's state is removed."""
    api = released_mid_drain()
    leader_pass(api)
    assert api.evicted == [], "the cancelled drain's evictions fill the minute"
    api.now = NOW + 49  # a: 69 s old, b: 59 s old
    leader_pass(api)
    assert [name for name, _ in api.evicted] == ["d"]
    api.now = NOW + 51
    leader_pass(api)
    assert [name for name, _ in api.evicted] == ["d", "e"]
    assert DRAIN not in api.nodes["n1"]["metadata"]["annotations"], "ledger pruned: the state removed"
    assert event_reasons(api, "n1") == ["GPUDrainCancelled"]


def test_requarantined_node_starts_a_new_drain_with_the_ledger() -> None:
    """A node quarantined again while its cancelled state still holds evictions: the new drain starts now
    and carries them (the rate), and its own GPUDrainStarted is written."""
    api = released_mid_drain()
    leader_pass(api)  # cancelled
    rec = QuarantineRecord("quarantined", "gpu-missing", evidence=(Evidence("gpu-missing"),),
                           quarantined_at=NOW + 5)  # fmt: skip
    api.nodes["n1"]["metadata"]["annotations"][QUARANTINE_RECORD] = rec.encode()
    api.nodes["n1"]["spec"]["taints"] = [TAINT]
    api.nodes["n2"]["spec"]["taints"] = []  # n2 released meanwhile
    api.now = NOW + 10
    snap = build_snapshot(api.nodes.values(), api.pods.values(), resource=GPU)
    (n1,) = [n for n in snap.nodes if n.name == "n1"]
    assert n1.started is None and len(n1.evictions) == 2
    leader_pass(api)
    state = state_of(api, "n1")
    assert state is not None and state.cancelled is None and state.started == NOW + 10
    assert {e.pod for e in state.evictions} >= {"ml/a", "ml/b"}
    assert api.evicted == [], "the carried evictions fill the minute"
    assert "GPUDrainStarted" in event_reasons(api, "n1")


def dpod(name: str, uid: str, **kw: Any) -> DrainPod:
    return DrainPod("ml", name, uid, ("0",), 1, **kw)


@pytest.mark.parametrize(
    ("state", "pods", "evented", "now", "announce", "owed", "after"),
    [
        pytest.param(
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5),)),
            [],
            {"u1"},
            NOW,
            True,
            ["u1"],
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5, True),), cancelled=NOW),
            id="first-pass: announce, write the owed Event, keep the ledger",
        ),
        pytest.param(
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5),)),
            [],
            set(),
            NOW,
            True,
            ["u1"],
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5),), cancelled=NOW),
            id="event-not-written: still owed in the cancelled state",
        ),
        pytest.param(
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5, True),), cancelled=NOW - 1),
            [],
            set(),
            NOW,
            False,
            [],
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5, True),), cancelled=NOW - 1),
            id="cancelled: nothing to announce, kept within the minute",
        ),
        pytest.param(
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 61, True),), cancelled=NOW - 1),
            [],
            set(),
            NOW,
            False,
            [],
            None,
            id="cancelled-and-pruned: the state goes",
        ),
        pytest.param(
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5),)),
            [dpod("a", "u1")],
            set(),
            NOW,
            True,
            [],
            DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5),), cancelled=NOW),
            id="entered-never-sent(pod-running): no Event, counted for the minute",
        ),
        pytest.param(
            DrainState(NOW - 30, pending=("ml/c",), blocked={"ml/c": "PDB"}),
            [],
            set(),
            NOW,
            True,
            [],
            None,
            id="no-ledger: the state goes at once",
        ),
    ],
)
def test_plan_cancel(
    state: DrainState, pods: list[DrainPod], evented: set[str], now: float, announce: bool, owed: list[str],
    after: DrainState | None,
) -> None:  # fmt: skip
    step = plan_cancel("n1", state, pods)
    assert bool(step.announce) is announce
    assert [e.uid for e in step.owed] == owed
    assert after_cancel(step, evented, now) == after


def test_cancelled_state_round_trip() -> None:
    state = DrainState(NOW - 30, evictions=(Eviction("ml/a", "u1", NOW - 5, True),), cancelled=NOW)
    assert decode(state.encode()) == (state, "")
