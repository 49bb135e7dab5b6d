"""The extender's jobs (model feed, error trends, bind Events writer) live and die together, and its
shutdown lets the Events writer finish what the bind verb queued."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from controller.extender.events import FAILED, BindEvent
from controller.extender.runtime import build_extender
from controller.gpus.feed import ModelFeed
from controller.gpus.model import ClusterModel
from gpuwarden.config.root import Config
from gpuwarden.kube import EventType, KubeClient
from tests.unit.extender_support import node
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


class SyncingFeed:
    """A model feed that fills the model with `nodes` 8-GPU nodes, marks it synced and then idles."""

    def __init__(self, model: ClusterModel, nodes: int) -> None:
        self.model, self.nodes = model, nodes

    async def run(self) -> None:
        for i in range(self.nodes):
            self.model.upsert_node(node(f"n{i:03d}"))
        self.model.nodes_synced = self.model.pods_synced = True
        await asyncio.Event().wait()


@pytest.mark.parametrize("counts", [[1, 2, 4, 8], []], ids=["warm-four-sizes", "warm-off"])
async def test_ready_once_synced_and_the_usual_sizes_are_answered_for_every_node(counts: list[int]) -> None:
    config = Config.model_validate({"extender": {"warm_gpu_counts": counts}})
    ext = build_extender(config, cast(KubeClient, object()), recorder=Gated())
    ext.freeze_gc = False
    ext.feed = cast(ModelFeed, SyncingFeed(ext.model, 450))  # more than one chunk of WARM_CHUNK
    assert not ext.ready()
    running = asyncio.create_task(ext.run())
    for _ in range(200):
        if ext.ready():
            break
        await asyncio.sleep(0.01)
    assert ext.ready() and ext.model.synced
    views = [ext.model.view(name) for name in ext.model.node_names()]
    cached = {key for view in views if view is not None for key in view.memo if key != "healthy"}
    expected = {(kind, k, None) for kind in ("assess", "choose") for k in counts}
    assert cached == expected
    assert all(len(view.memo) == (2 * len(counts) + 1 if counts else 0) for view in views if view)
    assert len(ext.service.answers) == len(counts) * len(views)  # pre-encoded, kept until a node changes
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_a_failing_warm_up_neither_stops_the_extender_nor_keeps_it_unready(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> int:
        raise ValueError("odd node")

    monkeypatch.setattr("controller.extender.runtime.warm", broken)
    ext = build_extender(Config(), cast(KubeClient, object()), recorder=Gated())
    ext.freeze_gc = False
    ext.feed = cast(ModelFeed, SyncingFeed(ext.model, 3))
    running = asyncio.create_task(ext.run())
    for _ in range(200):
        if ext.ready():
            break
        await asyncio.sleep(0.01)
    assert ext.ready() and not running.done()  # the feed and the Events writer keep running
    assert "warming the extender's answers failed" in caplog.text
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


def test_warm_gpu_counts_are_normalised() -> None:
    config = Config.model_validate({"extender": {"warm_gpu_counts": [8, 1, 1]}})
    assert config.extender.warm_gpu_counts == [1, 8]
