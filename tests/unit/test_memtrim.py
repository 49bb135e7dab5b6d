"""gpuwarden.memtrim: trims through the C library's malloc_trim where there is one, a no-op elsewhere."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from gpuwarden import memtrim


def test_trim_reports_whether_the_c_library_can() -> None:
    has = memtrim._malloc_trim() is not None
    if sys.platform == "linux":  # the image and the development machines: glibc
        assert has
    assert memtrim.trim() is has


async def test_the_trimmer_trims_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    three = asyncio.Event()

    def fake(pad: int) -> int:
        calls.append(pad)
        if len(calls) == 3:
            three.set()
        return 1

    monkeypatch.setattr(memtrim, "_malloc_trim", lambda: fake)
    task = asyncio.ensure_future(memtrim.run_trimmer(0.01))
    await asyncio.wait_for(three.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(calls) == {0}


async def test_without_malloc_trim_the_trimmer_ends_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memtrim, "_malloc_trim", lambda: None)
    assert memtrim.trim() is False
    await asyncio.wait_for(memtrim.run_trimmer(0.01), timeout=5)


async def test_the_adapter_trims_after_each_cache_refresh_round(monkeypatch: pytest.MonkeyPatch) -> None:
    from adapter.app import Adapter
    from adapter.cache import ValueCache

    trimmed = asyncio.Event()
    monkeypatch.setattr(memtrim, "trim", lambda: trimmed.set() or True)
    cache: ValueCache[Any] = ValueCache(refresh_interval=15, max_age=60, idle_expiry=600)

    async def fetch() -> Any:
        return {"pod-a": (1.0, 0.0)}

    await cache.get("key", fetch)
    task = asyncio.ensure_future(Adapter._trim_after_refreshes(cache))
    await asyncio.sleep(0)
    assert not trimmed.is_set()  # nothing refreshed yet: no trim
    assert await cache.refresh_due(everything=True) == 1
    await asyncio.wait_for(trimmed.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
