"""The benches' stand-ins keep up with what they stand in for: a missing method fails a bench at run time
only (bench_nominations did, on `emit_once`, unnoticed until a bench run)."""

from __future__ import annotations

import inspect

import pytest

from gpuwarden.kube.events import EventRecorder
from tests.bench import bench_nominations, bench_preemption


def public_coroutines(cls: type) -> set[str]:
    return {n for n, f in inspect.getmembers(cls, inspect.iscoroutinefunction) if not n.startswith("_")}


@pytest.mark.parametrize("fake", [bench_nominations.NullRecorder, bench_preemption.NullRecorder])
def test_null_recorders_answer_every_event_write(fake: type) -> None:
    writes = {n for n in public_coroutines(EventRecorder) if n.startswith("emit")}
    assert writes and writes <= public_coroutines(fake), writes - public_coroutines(fake)
