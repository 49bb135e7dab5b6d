"""controller.app's pass scheduling: a pass is never cut short by a stop (within its grace), a cache that
dies is an error rather than a silent hang, and the first pass comes right after the caches sync.

The loops here are stand-ins with the `PeriodicLoop` surface whose passes block on an event, so each test
decides when a pass ends; APScheduler and asyncio are real."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest

from controller.app import PassScheduler, run_loops
from gpuwarden.kube import Informer

HANG_GUARD = 60.0
"""Turns the hang these tests guard against into a failure; never reached when the code is right."""


class Cache:
    """An informer stand-in: syncs at once unless `sync` is False, and fails with `error` when `broken`
    is set (before syncing if `sync` is False)."""

    def __init__(self, *, sync: bool = True, error: Exception | None = None) -> None:
        self.sync = sync
        self.error = error
        self.synced = asyncio.Event()
        self.broken = asyncio.Event()
        if error is not None and not sync:
            self.broken.set()

    async def run(self) -> None:
        if self.sync:
            self.synced.set()
        await self.broken.wait()
        if self.error is not None:
            raise self.error
        await asyncio.Event().wait()


class Loop:
    """A `PeriodicLoop` whose passes run until `release` is set."""

    def __init__(self, cache: Cache | None = None, interval: float = 3600.0) -> None:
        self.cache = cache or Cache()
        self._interval = interval
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.passes = 0
        self.finished = False
        self.cancelled = False

    def interval(self) -> float | None:
        return self._interval

    async def run_once(self, leading: asyncio.Event | None = None) -> object:
        self.passes += 1
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return None

    def ready(self) -> bool:
        return self.cache.synced.is_set()

    async def wait_ready(self) -> None:
        await self.cache.synced.wait()

    def caches(self) -> list[Informer]:
        return [cast(Informer, self.cache)]


def leader() -> asyncio.Event:
    leading = asyncio.Event()
    leading.set()
    return leading


async def test_stop_lets_a_running_pass_finish() -> None:
    """A pass between writing a taint and writing its Event when the controller is told to stop."""
    loop, stop = Loop(), asyncio.Event()
    running = asyncio.create_task(run_loops(leader(), stop, health=loop))
    async with asyncio.timeout(HANG_GUARD):
        await loop.started.wait()
    stop.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert not running.done() and not loop.cancelled  # waiting for the pass, not cancelling it
    loop.release.set()
    await running
    assert loop.finished and not loop.cancelled and loop.passes == 1


async def test_a_pass_beyond_the_grace_is_cancelled_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    loop, stop = Loop(), asyncio.Event()
    running = asyncio.create_task(run_loops(leader(), stop, grace=0.0, health=loop))
    async with asyncio.timeout(HANG_GUARD):
        await loop.started.wait()
    with caplog.at_level(logging.WARNING, logger="controller.app"):
        stop.set()
        await running
    assert loop.cancelled and not loop.finished
    [record] = [r for r in caplog.records if r.getMessage().startswith("pass still running at shutdown")]
    assert record.__dict__["loop"] == "health"


async def test_a_cache_failing_before_its_first_list_ends_run_loops_with_its_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Loop(Cache(sync=False, error=RuntimeError("nodes is forbidden")))
    with pytest.raises(RuntimeError, match="nodes is forbidden"):
        async with asyncio.timeout(HANG_GUARD):
            await run_loops(leader(), asyncio.Event(), health=loop)
    assert loop.passes == 0
    assert any(r.getMessage() == "loop cache failed; stopping the loops" for r in caplog.records)


async def test_a_cache_failing_later_ends_run_loops_after_the_running_pass() -> None:
    cache = Cache(error=RuntimeError("watch gone"))
    loop = Loop(cache)
    running = asyncio.create_task(run_loops(leader(), asyncio.Event(), health=loop))
    async with asyncio.timeout(HANG_GUARD):
        await loop.started.wait()
    cache.broken.set()
    loop.release.set()
    with pytest.raises(RuntimeError, match="watch gone"):
        async with asyncio.timeout(HANG_GUARD):
            await running
    assert loop.finished


async def test_the_first_pass_comes_once_the_caches_sync() -> None:
    """As run_controller schedules: not before the caches are listed (that pass would be skipped and the
    next one come a whole interval later), and right after."""
    loop = Loop(Cache(sync=False), interval=3600.0)
    passes = PassScheduler(leader())
    assert passes.add("health", loop)
    starting = asyncio.create_task(passes.start_when_ready())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not passes.scheduler.running and loop.passes == 0
    loop.cache.synced.set()
    await starting
    async with asyncio.timeout(HANG_GUARD):
        await loop.started.wait()
    assert loop.passes == 1
    loop.release.set()
    await passes.stop()
    assert loop.finished and not passes.scheduler.running


def test_a_disabled_loop_is_not_scheduled() -> None:
    passes = PassScheduler(leader())
    assert not passes.add("health", cast(Loop, type("Off", (Loop,), {"interval": lambda self: None})()))
    assert passes.scheduler.get_jobs() == []
