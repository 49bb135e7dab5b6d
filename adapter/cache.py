"""The demand-driven value cache: Prometheus load follows what HPAs ask for, not how many HPAs there are.

Why: prometheus-adapter sends one query per HPA metric per sync; 1,000 HPAs x 2 metrics mean 8,000 queries
a minute. Here each distinct (metric, resource, namespace, metric selector) that someone asked for is one
entry, answered by one grouped query for the whole namespace; the refresher re-runs those queries once per
refresh interval (default 15 s, the HPA's sync period) — entries sharing a batch key (the same metric in
several namespaces) with a single query per `batch_limit` namespaces — and every request in between is
answered from memory. Entries nobody asked for in `idle_expiry` seconds are dropped.

Rules that keep HPAs safe:
- an answer older than `max_age` is never served; the request then queries Prometheus itself and fails
  with the Prometheus error (503 upstream) if that fails too — never a stale or made-up value;
- a failed refresh keeps the last good answer (until `max_age`) and is retried at the next interval;
- concurrent misses for one key share a single query (no thundering herd after a restart), and misses
  for keys of one batch (the same metric in other namespaces) that arrive while such a miss is being
  fetched share the next batched query: a cold start of 1,000 KEDA triggers over 100 namespaces waits on
  a handful of queries, not on 100 queued behind the concurrency limit.

The cache is generic over the stored value; it does not know PromQL, wire formats or Kubernetes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Fetch = Callable[[], Awaitable[T]]
FetchMany = Callable[[list[Hashable]], Awaitable[dict[Hashable, T]]]
"""Answers for several keys with one query; must return a value for every key it is given."""


@dataclass
class _Entry(Generic[T]):
    fetch: Fetch[T]
    last_used: float
    value: T | None = None
    fetched_at: float | None = None
    inflight: asyncio.Future[T] | None = None
    failing: bool = False
    labels: tuple[str, ...] = field(default=())
    batch: tuple[Hashable, FetchMany[T]] | None = None


class ValueCache(Generic[T]):
    """Answers keyed by a hashable key, refreshed in the background while in use."""

    def __init__(
        self,
        *,
        refresh_interval: float,
        max_age: float,
        idle_expiry: float,
        concurrency: int = 8,
        batch_limit: int = 100,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`batch_limit` caps the keys one batched query serves, bounding the size of each answer."""
        self.refresh_interval = refresh_interval
        self.max_age = max_age
        self.idle_expiry = idle_expiry
        self._clock = clock
        self._batch_limit = batch_limit
        self._entries: dict[Hashable, _Entry[T]] = {}
        self._limit = asyncio.Semaphore(concurrency)
        self._refreshed = asyncio.Event()
        self._misses: dict[Hashable, list[tuple[Hashable, asyncio.Future[T]]]] = {}
        """Per batch key: missed keys waiting for its next batched fetch, with the futures readers await."""
        self._draining: dict[Hashable, asyncio.Task[None] | None] = {}
        """Batch keys with a miss being fetched: the first miss's own query (None), then the drain."""
        self.rounds = 0
        """`refresh_due` rounds that refreshed at least one entry."""

    def __len__(self) -> int:
        return len(self._entries)

    async def get(
        self,
        key: Hashable,
        fetch: Fetch[T],
        *,
        group: str = "",
        batch: tuple[Hashable, FetchMany[T]] | None = None,
    ) -> tuple[T, float]:
        """(value, fetched_at) for `key`; fetches (once, shared) when missing or older than `max_age`.

        Keys with the same `batch[0]` are refreshed together by one `batch[1]` call in the background.
        """
        now = self._clock()
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(fetch=fetch, last_used=now, labels=(group,), batch=batch)
        entry.last_used = now
        if (
            entry.value is not None
            and entry.fetched_at is not None
            and now - entry.fetched_at <= self.max_age
        ):
            return entry.value, entry.fetched_at
        if entry.inflight is None and entry.batch is not None and entry.batch[0] in self._draining:
            self._join_batch(key, entry, entry.batch[0])
        elif entry.inflight is None and entry.batch is not None:
            batch = entry.batch
            self._draining[batch[0]] = None  # misses of this batch queue up until this one is answered
            self._start(key, entry).add_done_callback(lambda _: self._after_first(batch))
        value = await self._refresh(key, entry)
        assert entry.fetched_at is not None
        return value, entry.fetched_at

    def _join_batch(self, key: Hashable, entry: _Entry[T], batch_key: Hashable) -> None:
        """Queue a missed key for its batch's next fetch (a miss of that batch is being fetched)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        entry.inflight = future
        self._misses.setdefault(batch_key, []).append((key, future))

    def _after_first(self, batch: tuple[Hashable, FetchMany[T]]) -> None:
        """The batch's first miss (its own query, as any single miss) is answered: fetch the misses that
        queued meanwhile, or let the next miss be a first one again."""
        if self._misses.get(batch[0]):
            self._draining[batch[0]] = asyncio.ensure_future(self._drain(batch))
        else:
            self._draining.pop(batch[0], None)

    async def _drain(self, batch: tuple[Hashable, FetchMany[T]]) -> None:
        """Fetch the batch's queued misses, `batch_limit` keys per query, until none wait; misses that
        arrive during a fetch join the next one."""
        batch_key, fetch_many = batch
        try:
            while queue := self._misses.get(batch_key):
                taken, self._misses[batch_key] = queue[: self._batch_limit], queue[self._batch_limit :]
                started = self._clock()
                try:
                    answers = await self._fetch_many([key for key, _ in taken], fetch_many)
                except Exception as exc:
                    answers, failure = None, exc
                for key, future in taken:
                    entry = self._entries.get(key)
                    if entry is not None and entry.inflight is future:
                        entry.inflight = None
                    if future.done():
                        continue
                    if answers is None:
                        if entry is not None and not entry.failing:
                            log.warning("cache fetch failed", extra={"key": str(key), "error": str(failure)})
                            entry.failing = True
                        future.set_exception(failure)
                        continue
                    if entry is not None:
                        entry.value, entry.fetched_at, entry.failing = answers[key], started, False
                    future.set_result(answers[key])
        finally:
            self._draining.pop(batch_key, None)
            for _, future in self._misses.pop(batch_key, []):  # cancelled mid-drain (shutdown)
                future.cancel()

    def _start(self, key: Hashable, entry: _Entry[T]) -> asyncio.Future[T]:
        if entry.inflight is None:
            entry.inflight = asyncio.ensure_future(self._run(key, entry, self._limited(entry.fetch)))
        return entry.inflight

    async def _refresh(self, key: Hashable, entry: _Entry[T]) -> T:
        return await asyncio.shield(self._start(key, entry))

    def _limited(self, fetch: Fetch[T]) -> Fetch[T]:
        async def run() -> T:
            async with self._limit:
                return await fetch()

        return run

    async def _fetch_many(self, keys: list[Hashable], fetch_many: FetchMany[T]) -> dict[Hashable, T]:
        async with self._limit:
            return await fetch_many(keys)

    async def _refresh_batch(self, keys: list[Hashable], fetch_many: FetchMany[T]) -> None:
        """One `fetch_many` for all `keys`; each entry takes its own answer from the shared result."""
        shared: asyncio.Future[dict[Hashable, T]] = asyncio.ensure_future(self._fetch_many(keys, fetch_many))

        def take(key: Hashable) -> Fetch[T]:
            async def pick() -> T:
                return (await asyncio.shield(shared))[key]

            return pick

        tasks = []
        for key in keys:
            entry = self._entries[key]
            entry.inflight = asyncio.ensure_future(self._run(key, entry, take(key)))
            tasks.append(entry.inflight)
        await asyncio.gather(shared, *tasks, return_exceptions=True)

    async def _run(self, key: Hashable, entry: _Entry[T], fetch: Fetch[T]) -> T:
        try:
            started = self._clock()
            value = await fetch()
            entry.value, entry.fetched_at = value, started
            if entry.failing:
                log.info("cache refresh recovered", extra={"key": str(key)})
            entry.failing = False
            return value
        except Exception as exc:
            if not entry.failing:
                log.warning("cache refresh failed", extra={"key": str(key), "error": str(exc)})
            entry.failing = True
            raise
        finally:
            entry.inflight = None

    def due(self, *, everything: bool = False) -> list[Hashable]:
        """Keys whose answer is at least one refresh interval old (all with `everything`); drops idle ones."""
        now = self._clock()
        keys: list[Hashable] = []
        for key, entry in list(self._entries.items()):
            if now - entry.last_used > self.idle_expiry:
                del self._entries[key]
            elif entry.inflight is None and (
                everything or entry.fetched_at is None or now - entry.fetched_at >= self.refresh_interval
            ):
                keys.append(key)
        return keys

    async def refresh_due(self, *, everything: bool = False) -> int:
        """Refresh every due entry (batched where possible, bounded concurrency); returns how many."""
        keys = self.due(everything=everything)
        batches: dict[Hashable, list[Hashable]] = {}
        tasks: list[Awaitable[object]] = []
        for key in keys:
            entry = self._entries[key]
            if entry.batch is None:
                tasks.append(self._refresh(key, entry))
            else:
                batches.setdefault(entry.batch[0], []).append(key)
        for members in batches.values():
            batch = self._entries[members[0]].batch
            assert batch is not None
            for start in range(0, len(members), self._batch_limit):
                tasks.append(self._refresh_batch(members[start : start + self._batch_limit], batch[1]))
        await asyncio.gather(*tasks, return_exceptions=True)
        if keys:
            self.rounds += 1
            done, self._refreshed = self._refreshed, asyncio.Event()
            done.set()
        return len(keys)

    async def refreshed(self, after: int) -> None:
        """Return once more than `after` refresh rounds refreshed anything (failed refreshes included).

        KEDA's external-push streams read `rounds`, evaluate, then wait here: a round that ends while they
        evaluate is not missed."""
        while self.rounds <= after:
            await self._refreshed.wait()

    async def run(self, tick: float | None = None) -> None:
        """Refresh due entries forever; `tick` (default a quarter interval) bounds the added lag."""
        step = tick if tick is not None else max(0.25, self.refresh_interval / 4)
        while True:
            try:
                await self.refresh_due()
            except Exception:
                log.exception("cache refresher crashed; continuing")
            await asyncio.sleep(step)

    async def aclose(self) -> None:
        """Cancel refreshes in flight (at shutdown), so no task outlives the event loop."""
        tasks: list[asyncio.Future[Any]] = [t for t in self._draining.values() if t is not None]
        tasks += [e.inflight for e in self._entries.values() if e.inflight is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def snapshot(self) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float]]:
        """({(group,): entries}, {(group,): oldest age in seconds}) for the self-metrics."""
        now = self._clock()
        counts: dict[tuple[str, ...], float] = {}
        ages: dict[tuple[str, ...], float] = {}
        for entry in self._entries.values():
            counts[entry.labels] = counts.get(entry.labels, 0) + 1
            if entry.fetched_at is not None:
                ages[entry.labels] = max(ages.get(entry.labels, 0.0), now - entry.fetched_at)
        return counts, ages


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a miss's failure as seen: its readers may all have gone (cancelled) before it failed."""
    if not future.cancelled():
        future.exception()
