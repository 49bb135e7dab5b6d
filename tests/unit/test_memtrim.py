"""gpuwarden.memtrim: trims through the C library's malloc_trim where there is one, a no-op elsewhere."""

from __future__ import annotations

import asyncio
import sys

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
