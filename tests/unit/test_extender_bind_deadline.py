"""Binds inside the scheduler's patience: the deadline, the join of a retried bind, shedding (issue 47).

The clock is a fake monotonic one the fake API server advances per call (`Slow`), so "the PATCH took 6 s"
is a fact of the test, not a sleep; both bind protocols are run.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from controller.extender.admission import CAP, FLOOR, BindRate, admit, deadline_of
from controller.extender.bind import AlwaysSole, Binder
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import Settings
from tests.unit.extender_support import FakePodApi, model, node, pod

NOW = 1_700_000_000.0
SETTINGS = Settings(fleet_max_numa_gpus=4)
TIMEOUT = 5.0


@pytest.mark.parametrize(
    ("inflight", "rate", "budget", "admitted"),
    [
        (0, None, 4.5, True),
        (FLOOR - 1, 0.0, 4.5, True),
        (FLOOR, None, 4.5, True),
        (CAP, None, 4.5, False),
        (FLOOR, 0.0, 4.5, False),
        (44, 10.0, 4.5, True),
        (45, 10.0, 4.5, False),
        (100, 100.0, 4.5, True),
        (FLOOR, 10.0, 0.0, False),
        (FLOOR, math.inf, 0.1, True),
    ],
    ids=[
        "idle",
        "below-the-floor-even-if-nothing-finishes",
        "rate-unknown-below-the-cap",
        "rate-unknown-at-the-cap",
        "nothing-finishing",
        "45th-waits-4.5s-fits",
        "46th-waits-4.6s-shed",
        "fast-binds-deep-queue",
        "no-time-left",
        "instant-binds",
    ],
)
def test_admit(inflight: int, rate: float | None, budget: float, admitted: bool) -> None:
    assert admit(inflight, rate, budget) is admitted


def test_deadline_leaves_a_margin_of_the_timeout() -> None:
    assert deadline_of(100.0, 5.0) == pytest.approx(104.5)
    assert deadline_of(100.0, 1.0) == pytest.approx(100.9)


def test_bind_rate_is_measured_from_the_busy_period_s_first_finish() -> None:
    meter = BindRate(window=5.0, min_span=0.2)
    assert meter.rate(0.0) is None
    meter.started(1000.0, running=0)  # a burst after an idle hour; its first binds take 0.5 s
    meter.finished(1000.5)
    assert meter.rate(1000.6) is None  # 0.1 s since the first finish: too short to say
    for i in range(10):
        meter.finished(1000.5 + 0.05 * (i + 1))
    assert meter.rate(1001.0) == pytest.approx(20.0)  # 10 in the 0.5 s after the first, not 11 in 1 s
    assert meter.rate(1010.0) == 0.0  # binds still running, none finished in the last 5 s
    meter.started(1020.0, running=0)  # a new busy period
    assert meter.rate(1020.5) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Slow(FakePodApi):
    """The fake API server on a fake clock: each call of a kind advances it by `cost[kind]` seconds; a call
    of a kind in `gate` waits for that event first (a held request)."""

    def __init__(self, pods: list[dict[str, Any]], clock: Clock) -> None:
        super().__init__(pods)
        self.clock = clock
        self.cost: dict[str, float | list[float]] = {}
        """Seconds per call of a kind; a list is used up one call at a time, then calls cost nothing."""
        self.gate: dict[str, asyncio.Event] = {}

    async def _step(self, kind: str) -> None:
        if kind in self.gate:
            await self.gate[kind].wait()
        cost = self.cost.get(kind, 0.0)
        self.clock.now += (cost.pop(0) if cost else 0.0) if isinstance(cost, list) else cost

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        await self._step("get")
        return await super().get_pod(namespace, name)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        await self._step("patch")
        return await super().patch_pod(namespace, name, patch)

    async def list_pods(self, label_selector: str) -> list[dict[str, Any]]:
        await self._step("list")
        return await super().list_pods(label_selector)

    async def list_node_pods(self, node: str) -> list[dict[str, Any]]:
        await self._step("list")
        return await super().list_node_pods(node)

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        await self._step("bind")
        await super().bind_pod(namespace, name, uid, node, annotations)


class Lease:
    """The sole binder just elected: its watch has not passed the takeover, so it lists the node first."""

    acquired_rv = "999999"

    def fenced(self) -> bool:
        return True


def args(name: str, target: str = "n") -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"uid-{name}", node=target)


def binder(api: Slow, protocol: str, actions: list[str], sole: Any = None) -> Binder:
    m = model([node("n")], api.pods.values())
    if protocol == "leader":
        sole = sole or AlwaysSole()
    b = Binder(
        api, m, lambda: SETTINGS, clock=lambda: NOW, watch_timeout=0.0, sole=sole, http_timeout=TIMEOUT,
        monotonic=api.clock, on_overload=actions.append,
    )  # fmt: skip

    def applied(obj: dict[str, Any]) -> None:
        m.upsert_pod(obj)
        b.pod_seen(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")

    api.on_write.append(applied)
    return b


def writes(api: FakePodApi) -> list[str]:
    return [c for c in api.calls if c.startswith(("patch", "bind"))]


async def test_claim_protocol_past_the_deadline_withdraws_its_claim_and_posts_no_binding() -> None:
    clock, actions = Clock(), list[str]()
    api = Slow([pod("p", 4)], clock)
    api.cost["patch"] = 6.0  # the claim PATCH returns after the scheduler gave up
    b = binder(api, "claim", actions)
    outcome = await b.bind(args("p"))
    assert (outcome.kind, outcome.cause) == ("error", "deadline"), outcome
    assert writes(api) == ["patch ml/p", "patch ml/p"]  # the claim, then its withdrawal: no Binding
    annotations = api.pods["ml/p"]["metadata"].get("annotations") or {}
    assert "gpuwarden.io/gpu-ids" not in annotations and not api.pods["ml/p"]["spec"].get("nodeName")
    assert not b.has_inflight() and b.running() == 0  # its GPUs are free for the next bind
    assert actions == ["cancelled"]
    api.cost["patch"] = 0.0  # the API server recovers; the scheduler's retry binds the pod once
    retry = await b.bind(args("p"))
    assert retry.kind == "bound" and api.calls.count("bind ml/p n") == 1
    assert api.held() == {"0": 1, "1": 1, "2": 1, "3": 1}


async def test_claim_protocol_late_before_its_claim_writes_nothing() -> None:
    clock, actions = Clock(), list[str]()
    api = Slow([], clock)
    api.cost["get"] = 4.6
    b = binder(api, "claim", actions)
    api.add(pod("p", 4))  # the watch has not delivered it: bind reads it live, slowly
    outcome = await b.bind(args("p"))
    assert outcome.cause == "deadline" and writes(api) == [] and not b.has_inflight()


async def test_leader_protocol_past_the_deadline_posts_no_binding_and_frees_the_set() -> None:
    clock, actions = Clock(), list[str]()
    api = Slow([pod("p", 4)], clock)
    api.cost["list"] = 2.5  # two consistent LISTs of the node (not caught up after a takeover): 5 s
    b = binder(api, "leader", actions, sole=Lease())
    outcome = await b.bind(args("p"))
    assert (outcome.kind, outcome.cause) == ("error", "deadline")
    assert writes(api) == [] and not b.has_inflight() and actions == ["cancelled"]


@pytest.mark.parametrize("protocol", ["claim", "leader"])
async def test_a_retry_joins_the_running_bind_of_its_pod(protocol: str) -> None:
    clock, actions = Clock(), list[str]()
    api = Slow([pod("p", 2)], clock)
    api.gate["bind"] = asyncio.Event()  # the Binding POST is held
    b = binder(api, protocol, actions)
    first = asyncio.ensure_future(b.bind(args("p")))
    for _ in range(20):  # the first runs up to its held Binding POST
        await asyncio.sleep(0)
    retry = asyncio.ensure_future(b.bind(args("p")))  # the scheduler gave up and asked again
    await asyncio.sleep(0)
    api.gate["bind"].set()
    outcomes = await asyncio.gather(first, retry)
    assert [o.kind for o in outcomes] == ["bound", "already_bound"], outcomes
    assert outcomes[1].choice == outcomes[0].choice  # the retry answers with the set the first recorded
    assert len([c for c in api.calls if c.startswith("bind")]) == 1
    assert actions == ["joined"]


async def test_a_retry_after_a_cancelled_bind_binds_itself() -> None:
    clock, actions = Clock(), list[str]()
    api = Slow([pod("p", 2)], clock)
    api.gate["patch"] = asyncio.Event()
    api.cost["patch"] = [2.0]  # the first's claim PATCH returns at 5 s (3 + 2), the rest at once
    b = binder(api, "claim", actions)
    first = asyncio.ensure_future(b.bind(args("p")))  # at 0 s: its deadline is 4.5 s
    await asyncio.sleep(0)
    clock.now = 3.0
    retry = asyncio.ensure_future(b.bind(args("p")))  # at 3 s, for the same node: joins the first
    await asyncio.sleep(0)
    api.gate["patch"].set()  # the first withdraws its claim and ends; the retry binds itself
    outcomes = await asyncio.gather(first, retry)
    assert (outcomes[0].cause, outcomes[1].kind) == ("deadline", "bound"), outcomes
    assert len([c for c in api.calls if c.startswith("bind")]) == 1 and sum(api.held().values()) == 2
    assert actions == ["joined", "cancelled"]


@pytest.mark.parametrize("protocol", ["claim", "leader"])
async def test_binds_beyond_what_can_finish_in_time_are_refused_at_once(protocol: str) -> None:
    clock, actions = Clock(), list[str]()
    api = Slow([pod(f"p{i}", 1) for i in range(40)], clock)
    api.gate["bind"] = asyncio.Event()
    b = binder(api, protocol, actions)
    held = [asyncio.ensure_future(b.bind(args(f"p{i}"))) for i in range(FLOOR)]  # from 0 s on
    for _ in range(20):
        await asyncio.sleep(0)
    for at in (0.1, 2.6):  # two binds finished since (one after the first): 0.4 binds/s at 2.6 s...
        b._rate.finished(at)
    clock.now = 2.6
    assert b.running() == FLOOR
    calls = len(api.calls)
    shed = await b.bind(args("p39"))  # ...so one more would wait 22 s behind eight
    assert (shed.kind, shed.cause) == ("error", "shed") and "retry" in shed.error
    assert len(api.calls) == calls and actions == ["shed"]  # refused before any request
    api.gate["bind"].set()
    assert [o.kind for o in await asyncio.gather(*held)] == ["bound"] * FLOOR
    assert b.running() == 0
