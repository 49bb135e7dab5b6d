"""The demand-driven value cache under an injected clock: hits, refresh, max age, failures, single flight."""

from __future__ import annotations

import asyncio

import pytest

from adapter.cache import ValueCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    """Counts fetches; `fail` makes the next fetches raise; `gate` holds them until set."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> dict[str, int]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("prometheus down")
        return {"value": self.calls}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> ValueCache[dict[str, int]]:
    return ValueCache(refresh_interval=15, max_age=60, idle_expiry=600, clock=clock)


async def test_miss_then_hit_from_memory(cache: ValueCache[dict[str, int]], clock: Clock) -> None:
    source = Source()
    assert await cache.get("k", source) == ({"value": 1}, 1000.0)
    clock.now += 14
    assert await cache.get("k", source) == ({"value": 1}, 1000.0)
    assert source.calls == 1


async def test_refresh_due_runs_one_query_per_key_per_interval(
    cache: ValueCache[dict[str, int]], clock: Clock
) -> None:
    a, b = Source(), Source()
    await cache.get("a", a)
    await cache.get("b", b)
    assert cache.due() == []
    clock.now += 15
    assert await cache.refresh_due() == 2
    assert await cache.refresh_due() == 0  # just refreshed
    assert (a.calls, b.calls) == (2, 2)
    assert (await cache.get("a", a))[0] == {"value": 2}


async def test_failed_refresh_keeps_the_last_answer_until_max_age(
    cache: ValueCache[dict[str, int]], clock: Clock
) -> None:
    source = Source()
    await cache.get("k", source)
    source.fail = True
    clock.now += 30
    await cache.refresh_due()
    assert (await cache.get("k", source))[0] == {"value": 1}  # 30 s old: still served
    clock.now += 31  # 61 s old: never served again
    with pytest.raises(ConnectionError):
        await cache.get("k", source)
    source.fail = False
    assert (await cache.get("k", source))[0]["value"] == source.calls


async def test_concurrent_misses_share_one_query(cache: ValueCache[dict[str, int]]) -> None:
    source = Source()
    source.gate = asyncio.Event()
    waiters = [asyncio.create_task(cache.get("k", source)) for _ in range(20)]
    await asyncio.sleep(0)
    source.gate.set()
    results = await asyncio.gather(*waiters)
    assert source.calls == 1
    assert all(r == ({"value": 1}, 1000.0) for r in results)


async def test_failure_is_shared_by_concurrent_waiters_and_not_cached(
    cache: ValueCache[dict[str, int]],
) -> None:
    source = Source()
    source.fail = True
    results = await asyncio.gather(*(cache.get("k", source) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert source.calls == 1
    source.fail = False
    assert (await cache.get("k", source))[0] == {"value": 2}


async def test_idle_entries_are_dropped(cache: ValueCache[dict[str, int]], clock: Clock) -> None:
    await cache.get("k", Source())
    clock.now += 601
    assert cache.due() == []
    assert len(cache) == 0


async def test_snapshot_counts_and_ages_by_group(cache: ValueCache[dict[str, int]], clock: Clock) -> None:
    await cache.get("a", Source(), group="custom")
    clock.now += 5
    await cache.get("b", Source(), group="custom")
    await cache.get("c", Source(), group="external")
    counts, ages = cache.snapshot()
    assert counts == {("custom",): 2, ("external",): 1}
    assert ages == {("custom",): 5.0, ("external",): 0.0}


async def test_batched_keys_refresh_with_one_call(cache: ValueCache[dict[str, int]], clock: Clock) -> None:
    calls: list[list[object]] = []

    async def many(keys: list[object]) -> dict[object, dict[str, int]]:
        calls.append(sorted(keys))  # type: ignore[type-var]
        return {k: {"value": 100 + len(calls)} for k in keys}

    for ns in ("a", "b", "c"):
        await cache.get(("m", ns), Source(), batch=("m", many))  # type: ignore[arg-type]
    await cache.get("solo", Source())
    clock.now += 15
    assert await cache.refresh_due() == 4
    assert calls == [[("m", "a"), ("m", "b"), ("m", "c")]]
    assert (await cache.get(("m", "b"), Source()))[0] == {"value": 101}


async def test_failed_batch_keeps_every_member_answer(
    cache: ValueCache[dict[str, int]], clock: Clock
) -> None:
    async def broken(keys: list[object]) -> dict[object, dict[str, int]]:
        raise ConnectionError("down")

    for ns in ("a", "b"):
        await cache.get(("m", ns), Source(), batch=("m", broken))  # type: ignore[arg-type]
    clock.now += 15
    await cache.refresh_due()
    assert (await cache.get(("m", "a"), Source()))[0] == {"value": 1}


async def test_batches_are_split_at_the_limit(clock: Clock) -> None:
    cache: ValueCache[dict[str, int]] = ValueCache(
        refresh_interval=15, max_age=60, idle_expiry=600, batch_limit=2, clock=clock
    )
    sizes: list[int] = []

    async def many(keys: list[object]) -> dict[object, dict[str, int]]:
        sizes.append(len(keys))
        return {k: {"value": 0} for k in keys}

    for ns in "abcde":
        await cache.get(("m", ns), Source(), batch=("m", many))  # type: ignore[arg-type]
    clock.now += 15
    await cache.refresh_due()
    assert sorted(sizes) == [1, 2, 2]


@pytest.mark.parametrize(("limit", "sizes"), [(100, [4]), (3, [3, 1])], ids=["one-query", "split-at-limit"])
async def test_cold_misses_of_one_batch_share_a_query_while_the_first_is_fetched(
    clock: Clock, limit: int, sizes: list[int]
) -> None:
    """A cold start: the first miss of a batch is its own query; the misses that arrive meanwhile for the
    batch's other keys share the next batched query(ies) instead of one query each."""
    cache: ValueCache[dict[str, int]] = ValueCache(
        refresh_interval=15, max_age=60, idle_expiry=600, batch_limit=limit, clock=clock
    )
    first = Source()
    first.gate = asyncio.Event()
    calls: list[list[object]] = []

    async def many(keys: list[object]) -> dict[object, dict[str, int]]:
        calls.append(list(keys))
        return {k: {"value": 100 + len(calls)} for k in keys}

    batch = ("m", many)
    a = asyncio.ensure_future(cache.get(("m", "a"), first, batch=batch))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    others = [
        asyncio.ensure_future(cache.get(("m", ns), Source(), batch=batch))  # type: ignore[arg-type]
        for ns in "bcde"
    ]
    again = asyncio.ensure_future(cache.get(("m", "b"), Source(), batch=batch))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert calls == []  # queued behind the first miss
    first.gate.set()
    assert (await a)[0] == {"value": 1}
    answers = [(await o)[0] for o in others]
    assert (await again)[0] == answers[0]  # the same key twice: one answer
    assert [len(c) for c in calls] == sizes
    assert answers[0] == {"value": 101}
    assert first.calls == 1
    # every key is now cached: the next reads are from memory
    assert (await cache.get(("m", "e"), Source(), batch=batch))[0] == answers[-1]  # type: ignore[arg-type]
    assert len(calls) == len(sizes)


async def test_a_failed_batched_miss_fails_its_readers_and_is_not_cached(
    cache: ValueCache[dict[str, int]],
) -> None:
    first = Source()
    first.gate = asyncio.Event()
    broken = True

    async def many(keys: list[object]) -> dict[object, dict[str, int]]:
        if broken:
            raise ConnectionError("down")
        return {k: {"value": 7} for k in keys}

    batch = ("m", many)
    a = asyncio.ensure_future(cache.get(("m", "a"), first, batch=batch))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    b = asyncio.ensure_future(cache.get(("m", "b"), Source(), batch=batch))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    first.gate.set()
    await a
    with pytest.raises(ConnectionError):
        await b
    broken = False
    # nothing was cached: a fresh miss, its own query again (the entry's first fetch; `many` answers 7)
    assert (await cache.get(("m", "b"), Source(), batch=batch))[0] == {"value": 1}  # type: ignore[arg-type]


async def test_refresh_rounds_wake_waiters_only_when_something_was_refreshed(
    cache: ValueCache[dict[str, int]], clock: Clock
) -> None:
    source = Source()
    await cache.get("k", source)
    waiter = asyncio.ensure_future(cache.refreshed(cache.rounds))
    assert await cache.refresh_due() == 0  # nothing due: no round, the waiter keeps waiting
    await asyncio.sleep(0)
    assert cache.rounds == 0 and not waiter.done()
    clock.now += 15
    source.fail = True
    assert await cache.refresh_due() == 1  # a failed refresh is a round too: streams re-evaluate
    await asyncio.wait_for(waiter, timeout=1)
    assert cache.rounds == 1
    await asyncio.wait_for(cache.refreshed(0), timeout=1)  # a round already past returns at once
