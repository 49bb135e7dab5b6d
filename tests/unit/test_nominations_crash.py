"""A leader killed between any two writes of a nomination clear: the next leader finishes it, and the
NominationCleared Event exists exactly once.

The act sequence of a clear: (1) the record marked (`"event": "pending"`), (2) `status.nominatedNodeName`
cleared, (3) the Event, named after the record, (4) the record removed. Each row kills the leader before
write k+1 (the real loop and actuator, a real `EventRecorder`, an in-memory API that raises `Killed` there);
a new leader with nothing in memory then runs two passes.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.nominations.loop import NominationLoop
from controller.nominations.snapshot import NominationRecord
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeConflict
from gpuwarden.kube import EventRecorder, Resource
from gpuwarden.wellknown import NOMINATION as NOMINATION_ANNOTATION
from tests.unit.test_nominations_act import NOW, FakeApi, FakeInformer, k8s_node, k8s_pod


class Killed(Exception):
    """The leader's process died here (SIGKILL)."""


class KillingApi(FakeApi):
    def __init__(self, *pods: dict[str, Any], kill_before: int | None) -> None:
        super().__init__(*pods)
        self.events: dict[str, dict[str, Any]] = {}
        self.count = 0
        self.kill_before = kill_before

    def _write(self) -> None:
        if self.kill_before is not None and self.count >= self.kill_before:
            raise Killed
        self.count += 1

    async def patch(self, resource: Resource, name: str, body: Any, **kw: Any) -> dict[str, Any]:
        self._write()
        return await super().patch(resource, name, body, **kw)

    async def create(self, resource: Resource, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.events:
            raise KubeConflict("already exists", status=409, reason="AlreadyExists")
        self._write()
        self.events[name] = body
        return body


def leader(api: KillingApi, now: float) -> NominationLoop:
    """A leader with nothing in memory: its own recorder, a cache that is what the API holds."""
    return NominationLoop(
        Config(), api, registry=CollectorRegistry(), clock=lambda: now,  # type: ignore[arg-type]
        pods=FakeInformer(list(api.pods.values())), nodes=FakeInformer([k8s_node()]),  # type: ignore[arg-type]
        recorder=EventRecorder(api, component="nominations", instance="leader"),  # type: ignore[arg-type]
    )  # fmt: skip


WRITES = ["mark", "clear", "event", "remove-record"]


@pytest.mark.parametrize("k", range(len(WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
async def test_clear_killed_between_writes_is_finished_once(k: int) -> None:
    pod = k8s_pod("p")
    pod["metadata"]["annotations"] = {NOMINATION_ANNOTATION: NominationRecord("n1", NOW - 301).encode()}
    api = KillingApi(pod, kill_before=k)
    try:
        await leader(api, NOW).run_once()
        killed = False
    except Killed:
        killed = True
    assert killed == (k < len(WRITES))
    api.kill_before = None
    for later in (NOW + 5, NOW + 10):
        await leader(api, later).run_once()

    assert api.pods["p"]["status"]["nominatedNodeName"] is None
    assert NOMINATION_ANNOTATION not in api.pods["p"]["metadata"]["annotations"]
    reasons = [e["reason"] for e in api.events.values()]
    assert reasons == ["NominationCleared"], api.events
