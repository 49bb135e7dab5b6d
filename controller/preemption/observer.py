"""The preemption observer: keeps the preemption graph and a UID index of pods current from two watches.

Why it exists: the throttle answers on every controller replica, each from its own memory, and that memory
must be derivable from the API (docs/architecture.md, safety rule 5) so replicas agree
and a restart loses nothing:

* a list+watch of `Preempted` Events (events.k8s.io/v1, field selector `reason=Preempted`; Events written
  through core/v1 are served there too) — each names victim, preemptor and node;
* a list+watch of live pods — the UID index the preempt verb resolves victims with (nodeCacheCapable
  requests carry only UIDs), the owners that make pods into workloads, and victims' DisruptionTarget
  conditions (the durable signal, seen even when an Event is lost). Deleted pods stay in a tombstone index
  for the chain window, because a victim is usually gone by the time its Event arrives. The same watch
  reads preemptors' preemption records (record.py): preemptions allowed by another replica or an earlier
  leader, counted as reservations until their signals arrive.

The pod watch is started first so Events find their pods. `PreemptionThrottle` exposes that pod informer
so the nomination loop reads the same cache instead of a second watch of every pod.

What it must not do: decide or write; it only reads the API and feeds the graph and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from controller.preemption.graph import Preemption, PreemptionGraph
from controller.preemption.metrics import PreemptionMetrics
from controller.preemption.record import record_of
from controller.preemption.signals import (
    PREEMPTED_REASON,
    PodMeta,
    Workload,
    parse_preempted,
    pod_meta,
    preempted_at,
    workload_from_name,
)
from gpuwarden.kube import DELETED, EVENTS, LIVE_PODS, PODS, SYNCED, Informer, WatchEvent
from gpuwarden.kube.watch import WatchSource

log = logging.getLogger(__name__)

PREEMPTED_EVENTS = f"reason={PREEMPTED_REASON}"


class PreemptionObserver:
    """Feeds `graph` from the API; `index` maps pod UID -> `PodMeta` for live (and recently deleted) pods."""

    def __init__(
        self,
        source: WatchSource,
        graph: PreemptionGraph,
        metrics: PreemptionMetrics,
        *,
        page_size: int = 500,
        watch_timeout: int = 300,
        prune_interval: float = 10.0,
        clock: Callable[[], float] = time.time,
        pods: Informer | None = None,
    ) -> None:
        self.graph = graph
        self.metrics = metrics
        self.clock = clock
        self.owns_pods = pods is None
        """False when `pods` is the process's shared live-pod informer (its owner runs it)."""
        self.pods = pods or Informer(
            source, PODS, field_selector=LIVE_PODS, page_size=page_size, watch_timeout=watch_timeout
        )
        if not self.owns_pods:
            self.pods.subscribe(self.on_pod)
        self.events = Informer(
            source, EVENTS, field_selector=PREEMPTED_EVENTS, page_size=page_size, watch_timeout=watch_timeout
        )
        self.index: dict[str, PodMeta] = {}
        self._tombstones: dict[str, tuple[float, PodMeta]] = {}
        self._prune_interval = prune_interval
        self.events_synced = False

    @property
    def synced(self) -> bool:
        """True once both watches completed their first list (the graph then reflects the API)."""
        return self.pods.synced.is_set() and self.events_synced

    def lookup(self, uid: str) -> PodMeta | None:
        """A live pod, or one deleted within the chain window."""
        meta = self.index.get(uid)
        if meta is None:
            tomb = self._tombstones.get(uid)
            meta = tomb[1] if tomb is not None else None
        return meta

    # --- event handlers (synchronous, so tests drive them without a server) -------------------------------

    def on_pod(self, event: WatchEvent) -> None:
        if event.type == SYNCED:
            return
        meta = pod_meta(event.object)
        if not meta.uid:
            return
        if event.type == DELETED:
            self.index.pop(meta.uid, None)
            self._tombstones[meta.uid] = (self.clock(), meta)
        else:
            self.index[meta.uid] = meta
            allowed = record_of(event.object)
            if allowed is not None:  # another replica's answer, or an earlier leader's GPU preemption
                self.graph.adopt(meta.uid, meta.workload, allowed, self.clock())
        marked = preempted_at(event.object)
        if marked is not None:
            at = marked or self.clock()
            record = Preemption(meta.uid, meta.workload, meta.node, at, victim_name=meta.key)
            claimed = self.graph.claimed_by(meta.uid)  # this replica allowed it: the preemptor is known
            if claimed is not None:
                record = replace(record, preemptor_uid=claimed[0], preemptor=claimed[1])
            self._observe(record)

    def on_event(self, event: WatchEvent) -> None:
        if event.type == SYNCED:
            self.events_synced = True
            return
        if event.type == DELETED:  # Events expire after an hour; the graph forgets by its own window
            return
        parsed = parse_preempted(event.object)
        if parsed is None:
            return
        victim = self.lookup(parsed.victim_uid)
        victim_workload = (
            victim.workload
            if victim is not None
            else workload_from_name(parsed.victim_namespace, parsed.victim_name)
        )
        preemptor = self.lookup(parsed.preemptor_uid)
        if preemptor is not None:
            preemptor_workload = preemptor.workload
        elif parsed.preemptor_name:
            preemptor_workload = workload_from_name(parsed.preemptor_namespace, parsed.preemptor_name)
        else:
            preemptor_workload = Workload(parsed.preemptor_namespace, parsed.preemptor_uid, "Pod")
        at = parsed.at if parsed.at is not None else self.clock()
        self._observe(
            Preemption(
                victim_uid=parsed.victim_uid or f"{parsed.victim_namespace}/{parsed.victim_name}",
                victim=victim_workload,
                node=parsed.node,
                at=at,
                victim_name=f"{parsed.victim_namespace}/{parsed.victim_name}",
                preemptor_uid=parsed.preemptor_uid,
                preemptor=preemptor_workload,
            )
        )

    def _observe(self, record: Preemption) -> None:
        seen = self.graph.observe(record)
        if seen is None:
            return
        if seen.new_victim:
            self.metrics.observed.inc()
        if seen.preemptor_learned:
            self.metrics.chain_depth.observe(seen.record.depth)
            log.info(
                "preemption observed",
                extra={
                    "victim": seen.record.victim_name,
                    "victim_workload": seen.record.victim.key,
                    "preemptor_workload": seen.record.preemptor.key if seen.record.preemptor else "",
                    "node": seen.record.node,
                    "depth": seen.record.depth,
                },
            )
        if seen.ping_pong:
            self.metrics.ping_pong.inc()

    def prune(self) -> None:
        now = self.clock()
        self.graph.prune(now)
        keep = now - self.graph.chain_window
        self._tombstones = {uid: t for uid, t in self._tombstones.items() if t[0] >= keep}

    # --- the loop ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run both watches and the pruning until cancelled (events start once pods are listed)."""
        pods = asyncio.create_task(
            self.pods.run(self.on_pod) if self.owns_pods else asyncio.Event().wait(),
            name="preemption-pod-informer",
        )
        try:
            await self.pods.synced.wait()
            await asyncio.gather(self.events.run(self.on_event), self._prune_loop())
        finally:
            pods.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pods

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(self._prune_interval)
            self.prune()
