"""Lease leader election: the pure decision table and the elector against an in-memory Lease store."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuwarden.errors import KubeConflict, KubeNotFound, KubeUnreachable
from gpuwarden.kube.leader import (
    LeaderElector,
    LeaseAction,
    LeaseDurations,
    LeaseSnapshot,
    decide_lease,
    lease_spec,
    release_spec,
    should_step_down,
    snapshot_of,
)
from gpuwarden.kube.resources import Resource

D = LeaseDurations()
WALL = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def snap(holder: str, observed_at: float = 100.0, duration: int = 15, transitions: int = 3) -> LeaseSnapshot:
    return LeaseSnapshot(
        holder,
        duration,
        transitions,
        "2026-03-01T11:00:00.000000Z",
        "2026-03-01T11:59:59.000000Z",
        "42",
        observed_at,
    )


@pytest.mark.parametrize(
    ("snapshot", "now", "action"),
    [
        pytest.param(None, 0.0, LeaseAction.CREATE, id="no-lease-create"),
        pytest.param(snap("me"), 100.0, LeaseAction.RENEW, id="ours-renew"),
        pytest.param(snap("me"), 999.0, LeaseAction.RENEW, id="ours-even-if-expired-renew"),
        pytest.param(snap(""), 100.0, LeaseAction.ACQUIRE, id="released-acquire-at-once"),
        pytest.param(snap("other"), 100.0, LeaseAction.WAIT, id="other-fresh-wait"),
        pytest.param(snap("other"), 114.9, LeaseAction.WAIT, id="other-just-before-expiry-wait"),
        pytest.param(snap("other"), 115.0, LeaseAction.ACQUIRE, id="other-expired-acquire"),
        pytest.param(snap("other", duration=60), 150.0, LeaseAction.WAIT, id="holder-duration-not-ours"),
        pytest.param(snap("other", duration=1), 101.0, LeaseAction.ACQUIRE, id="released-style-1s"),
    ],
)
def test_decide_lease(snapshot: LeaseSnapshot | None, now: float, action: LeaseAction) -> None:
    assert decide_lease(snapshot, "me", now, D) is action


@pytest.mark.parametrize(
    ("action", "snapshot", "transitions", "acquire_kept"),
    [
        pytest.param(LeaseAction.CREATE, None, 0, False, id="create"),
        pytest.param(LeaseAction.RENEW, snap("me"), 3, True, id="renew-keeps-acquire-time"),
        pytest.param(LeaseAction.ACQUIRE, snap("other"), 4, False, id="takeover-counts-transition"),
        pytest.param(LeaseAction.ACQUIRE, snap(""), 4, False, id="after-release-counts-transition"),
        pytest.param(LeaseAction.ACQUIRE, snap("me"), 3, False, id="reacquire-own-no-transition"),
    ],
)
def test_lease_spec(
    action: LeaseAction, snapshot: LeaseSnapshot | None, transitions: int, acquire_kept: bool
) -> None:
    spec = lease_spec(action, snapshot, "me", WALL, D)
    assert spec["holderIdentity"] == "me"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"] == "2026-03-01T12:00:00.000000Z"
    assert spec["leaseTransitions"] == transitions
    assert (spec["acquireTime"] == "2026-03-01T11:00:00.000000Z") is acquire_kept


def test_lease_spec_refuses_wait() -> None:
    with pytest.raises(ValueError):
        lease_spec(LeaseAction.WAIT, snap("other"), "me", WALL, D)


def test_release_spec() -> None:
    assert release_spec(snap("me", transitions=7), WALL) == {
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "acquireTime": "2026-03-01T12:00:00.000000Z",
        "renewTime": "2026-03-01T12:00:00.000000Z",
        "leaseTransitions": 7,
    }


def lease(holder: str | None, renew: str = "t1", rv: str = "5") -> dict[str, Any]:
    return {
        "metadata": {"name": "l", "resourceVersion": rv},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "renewTime": renew,
            "leaseTransitions": 1,
        },
    }


@pytest.mark.parametrize(
    ("previous", "obj", "observed_at"),
    [
        pytest.param(None, lease("a"), 50.0, id="first-sight"),
        pytest.param(
            snapshot_of(lease("a"), None, 10.0), lease("a", rv="6"), 10.0, id="same-record-new-rv-keeps"
        ),
        pytest.param(snapshot_of(lease("a"), None, 10.0), lease("a", renew="t2"), 50.0, id="renewed-moves"),
        pytest.param(snapshot_of(lease("a"), None, 10.0), lease("b"), 50.0, id="new-holder-moves"),
    ],
)
def test_snapshot_observed_at(
    previous: LeaseSnapshot | None, obj: dict[str, Any], observed_at: float
) -> None:
    assert snapshot_of(obj, previous, 50.0).observed_at == observed_at


def test_snapshot_of_released_lease_has_no_holder() -> None:
    assert snapshot_of(lease(None), None, 0.0).holder == ""


@pytest.mark.parametrize(
    ("last", "now", "down"),
    [
        pytest.param(100.0, 105.0, False, id="within-deadline"),
        pytest.param(100.0, 110.0, True, id="at-deadline"),
        pytest.param(100.0, 130.0, True, id="long-past"),
    ],
)
def test_should_step_down(last: float, now: float, down: bool) -> None:
    assert should_step_down(last, now, D) is down


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"lease_duration": 10, "renew_deadline": 10}, id="renew-not-below-lease"),
        pytest.param({"renew_deadline": 2, "retry_period": 2}, id="retry-too-long"),
        pytest.param({"retry_period": 0, "renew_deadline": 1, "lease_duration": 2}, id="zero-retry"),
    ],
)
def test_durations_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LeaseDurations(**kwargs)


# -------------------------------------------------------------------------------- elector, in-memory API
class LeaseStore:
    """One Lease with the API server's optimistic concurrency; `down` simulates an unreachable server."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.down = False

    def _guard(self) -> None:
        if self.down:
            raise KubeUnreachable("connection refused")

    async def get(self, resource: Resource, name: str, **_: Any) -> dict[str, Any]:
        self._guard()
        if self.obj is None:
            raise KubeNotFound("404", status=404)
        return copy.deepcopy(self.obj)

    async def create(self, resource: Resource, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self._guard()
        if self.obj is not None:
            raise KubeConflict("409 already exists", status=409, reason="AlreadyExists")
        self.rv += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)

    async def replace(self, resource: Resource, name: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self._guard()
        assert self.obj is not None
        if body["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise KubeConflict("409 modified", status=409, reason="Conflict")
        self.rv += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return WALL + timedelta(seconds=self.t)


def elector(
    store: LeaseStore,
    clock: Clock,
    identity: str,
    registry: CollectorRegistry | None = None,
    log: list[str] | None = None,
) -> LeaderElector:
    return LeaderElector(
        store,
        name="gpuwarden-controller",
        namespace="gpuwarden",
        identity=identity,
        registry=registry,
        monotonic=clock.mono,
        wall=clock.wall,
        on_started_leading=(lambda: log.append(f"{identity}+")) if log is not None else None,
        on_stopped_leading=(lambda: log.append(f"{identity}-")) if log is not None else None,
    )


async def test_two_candidates_exactly_one_leads_and_release_hands_over() -> None:
    store, clock, log = LeaseStore(), Clock(), []
    registry = CollectorRegistry()
    a, b = elector(store, clock, "a", registry, log), elector(store, clock, "b", registry, log)
    await a.step()
    await b.step()
    assert a.is_leader.is_set() and not b.is_leader.is_set()
    assert b.leader == "a"
    for _ in range(5):
        clock.t += 2
        await a.step()
        await b.step()
    assert a.is_leader.is_set() and not b.is_leader.is_set()  # renewals keep b out
    assert await a.release()
    assert not a.is_leader.is_set()
    clock.t += 0.1
    await b.step()  # released: taken on the very next step, no lease-duration wait
    assert b.is_leader.is_set()
    assert store.obj is not None and store.obj["spec"]["leaseTransitions"] == 1
    assert log == ["a+", "a-", "b+"]
    value = registry.get_sample_value
    assert value("gpuwarden_leader", {"lease": "gpuwarden/gpuwarden-controller"}) == 1  # b, shared series
    assert value("gpuwarden_leader_transitions_total", {"lease": "gpuwarden/gpuwarden-controller"}) == 3


async def test_dead_leader_is_replaced_after_the_lease_duration_on_the_observers_clock() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    await a.step()
    await b.step()  # b first observes a's record at t=1000
    clock.t += 14.9
    await b.step()
    assert not b.is_leader.is_set()
    clock.t += 0.1
    await b.step()
    assert b.is_leader.is_set()
    await a.step()  # a comes back: it sees b holding a live lease and steps down at once
    assert not a.is_leader.is_set()
    assert a.leader == "b"


async def test_leader_that_cannot_renew_steps_down_after_the_renew_deadline() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, clock, "a")
    await a.step()
    store.down = True
    clock.t += 9.9
    await a.step()
    assert a.is_leader.is_set()
    clock.t += 0.1
    await a.step()
    assert not a.is_leader.is_set()


async def test_lost_race_on_create_is_not_leadership() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    original_get = store.get

    async def get_then_a_creates(resource: Resource, name: str, **kw: Any) -> dict[str, Any]:
        store.get = original_get  # type: ignore[method-assign]
        try:
            return await original_get(resource, name, **kw)
        except KubeNotFound:
            await a.try_acquire_or_renew()  # a creates between b's read and b's create
            raise

    store.get = get_then_a_creates  # type: ignore[method-assign]
    assert await b.try_acquire_or_renew() is False
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "a"


async def test_run_releases_on_stop() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, clock, "a")
    a.durations = LeaseDurations(lease_duration=3, renew_deadline=2, retry_period=0.01)

    async def stop_when_leading() -> None:
        await a.is_leader.wait()
        a.stop()

    await asyncio.wait_for(asyncio.gather(a.run(), stop_when_leading()), 5)
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] is None
    assert store.obj["spec"]["leaseDurationSeconds"] == 1
    assert not a.is_leader.is_set()


async def test_release_when_not_holder_writes_nothing() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    await a.step()
    rv = store.rv
    assert await b.release() is False
    assert store.rv == rv


async def test_fence_ends_a_renew_deadline_after_the_step_that_wrote_and_before_anyone_can_take_over() -> (
    None
):
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert not a.fenced()
    await a.step()
    await b.step()
    assert a.fenced()
    store.down = True  # a can no longer renew; is_leader stays set until its next step notices
    clock.t += 9.9
    assert a.fenced() and a.is_leader.is_set()
    clock.t += 0.1
    assert not a.fenced() and a.is_leader.is_set()  # the fence ends first, without waiting for a step
    store.down = False
    clock.t += 5.0  # 15 s after b saw a's last write: only now may b take over
    await b.step()
    assert b.is_leader.is_set() and b.fenced()
    await a.step()
    assert not a.fenced() and not a.is_leader.is_set()


async def test_the_holder_advertises_its_annotations_and_followers_read_them() -> None:
    store, clock = LeaseStore(), Clock()
    a = LeaderElector(
        store, name="l", namespace="n", identity="a", monotonic=clock.mono, wall=clock.wall,
        annotations={"example.com/url": "http://10.0.0.1:8888/x"},
    )  # fmt: skip
    b = LeaderElector(
        store, name="l", namespace="n", identity="b", monotonic=clock.mono, wall=clock.wall,
        annotations={"example.com/url": "http://10.0.0.2:8888/x"},
    )  # fmt: skip
    await a.step()
    store.obj["metadata"].setdefault("annotations", {})["other"] = "kept"  # type: ignore[index]
    await b.step()
    assert b.holder_annotations["example.com/url"] == "http://10.0.0.1:8888/x"
    clock.t += 2
    await a.step()  # a renewal keeps what others wrote beside ours
    assert store.obj is not None and store.obj["metadata"]["annotations"]["other"] == "kept"
    assert await a.release()
    await b.step()
    assert b.is_leader.is_set()
    assert store.obj["metadata"]["annotations"]["example.com/url"] == "http://10.0.0.2:8888/x"


async def test_acquired_rv_is_the_write_that_made_us_leader_not_a_renewal() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, clock, "a")
    await a.step()
    first = a.acquired_rv
    assert first == store.obj["metadata"]["resourceVersion"]  # type: ignore[index]
    clock.t += 2
    await a.step()
    assert a.acquired_rv == first and store.obj["metadata"]["resourceVersion"] != first  # type: ignore[index]
    assert await a.release()
    await a.step()  # leads again: a new epoch
    assert a.acquired_rv == store.obj["metadata"]["resourceVersion"] != first  # type: ignore[index]
