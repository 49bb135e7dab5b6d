"""The extender's jobs (model feed, error trends, bind Events writer) live and die together, and its
shutdown lets the Events writer finish what the bind verb queued."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from controller.extender.events import FAILED, BindEvent
from controller.extender.feed import ModelFeed
from controller.extender.runtime import build_extender
from gpuwarden.config.root import Config
from gpuwarden.kube import EventType, KubeClient
from tests.unit.test_extender_events import Gated

EVENT = BindEvent("ml", "p", "uid-p", "n", FAILED, EventType.WARNING, "binding to node n failed: x")


class BreakingFeed:
    """A model feed whose watch fails once `broken` is set."""

    def __init__(self) -> None:
        self.broken = asyncio.Event()

    async def run(self) -> None:
        await self.broken.wait()
        raise RuntimeError("watch broke")


async def test_a_failing_job_cancels_the_others_and_later_events_count_as_dropped() -> None:
    registry = CollectorRegistry()
    sink = Gated()
    sink.gate.set()
    ext = build_extender(Config(), cast(KubeClient, object()), registry=registry, recorder=sink)
    feed = BreakingFeed()
    ext.feed = cast(ModelFeed, feed)
    assert ext.events is not None and ext.trends is None
    running = asyncio.create_task(ext.run())
    await asyncio.sleep(0)
    feed.broken.set()
    with pytest.raises(RuntimeError, match="watch broke"):
        await running
    # the Events writer did not outlive the extender: a bind answered now has its Event counted, not queued
    assert ext.events.offer(EVENT) is False and ext.events.queued == 0
    assert registry.get_sample_value("gpuwarden_extender_events_dropped_total") == 1


async def test_close_events_writes_what_is_queued_before_the_jobs_are_cancelled() -> None:
    sink = Gated()
    ext = build_extender(Config(), cast(KubeClient, object()), recorder=sink)
    ext.feed = cast(ModelFeed, BreakingFeed())
    assert ext.events is not None
    ext.events.offer(EVENT)
    running = asyncio.create_task(ext.run())
    closing = asyncio.create_task(ext.close_events(grace=30))
    await asyncio.sleep(0)
    assert not closing.done()
    sink.gate.set()
    await closing
    assert sink.notes == [EVENT.note] and not running.done()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
