"""EventQueue: the shared off-path Event writer (bind and preemption use it; their tests cover shutdown)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuwarden.kube import EventType, ObjectRef
from gpuwarden.kube.event_queue import EventQueue, PendingEvent


class Sink:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []
        self.flushes = 0

    async def emit(self, regarding: ObjectRef, **kw: Any) -> object:
        self.emitted.append({"regarding": regarding, **kw})
        return None

    async def flush(self) -> None:
        self.flushes += 1


def event(name: str) -> PendingEvent:
    return PendingEvent(
        ObjectRef("v1", "Pod", name, "ml"), "Reason", f"note {name}", "Act", EventType.WARNING,
        ObjectRef("v1", "Node", "n1"),
    )  # fmt: skip


async def test_offer_never_waits_and_counts_what_does_not_fit() -> None:
    drops: list[tuple[str, str]] = []
    queue = EventQueue(Sink(), capacity=2, on_drop=lambda e, why: drops.append((e.regarding.name, why)))
    assert [queue.offer(event(f"p{i}")) for i in range(3)] == [True, True, False]
    assert queue.queued == 2 and queue.dropped == 1 and drops == [("p2", "queue full")]


async def test_writer_passes_every_field_and_flushes_series_periodically() -> None:
    sink = Sink()
    queue = EventQueue(sink, flush_interval=0.01)
    queue.offer(event("a"))
    writer = asyncio.create_task(queue.run())
    await asyncio.sleep(0.05)
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    [written] = sink.emitted
    assert written == {
        "regarding": ObjectRef("v1", "Pod", "a", "ml"), "reason": "Reason", "note": "note a",
        "action": "Act", "type": EventType.WARNING, "related": ObjectRef("v1", "Node", "n1"),
    }  # fmt: skip
    assert sink.flushes >= 2  # periodic, and once more on the way out
    assert queue.closed and not queue.offer(event("late")) and queue.dropped == 1


async def test_a_cancellation_arriving_with_an_event_stops_the_writer() -> None:
    # The event and the cancellation land in the same loop turn: with 3.11's wait_for around the queue's
    # get, the got event was returned and the cancellation swallowed, and the writer ran on for ever.
    sink = Sink()
    queue = EventQueue(sink, flush_interval=30.0)
    writer = asyncio.create_task(queue.run())
    for _ in range(3):
        await asyncio.sleep(0)  # the writer now waits in the queue's get
    queue.offer(event("a"))
    writer.cancel()
    done, _ = await asyncio.wait({writer}, timeout=2.0)
    assert done == {writer} and writer.cancelled()
    assert [e["regarding"].name for e in sink.emitted] == ["a"]  # the last chance still wrote it
    assert queue.closed and queue.dropped == 0
