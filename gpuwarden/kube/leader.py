"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules and defaults.

Why it exists: the controller's mutating loops (quarantine, nomination cleanup, preemption throttle) must
run in exactly one replica at a time (docs/architecture.md, safety rule 6). This is
client-go's `leaderelection` semantics: a candidate takes the Lease when it is free (no holder, or not renewed
within its `leaseDurationSeconds` as *observed on our own clock*, so clock skew between replicas does not
matter), the leader renews every `retry_period`, and a leader that has not renewed within `renew_deadline`
stops leading. On shutdown the leader releases the Lease (empty holder, 1 s duration), so a standby takes over
on its next retry instead of waiting out the full lease duration. Every write is conditional on the
resourceVersion read, so two candidates cannot both win.

The decision is pure — `decide_lease(snapshot, identity, now, durations)` and `lease_spec(...)` — and
table-tested; `LeaderElector` is the shell. Leadership is visible as the `is_leader` event, optional
callbacks, and `gpuwarden_leader{lease}`. It must not run or cancel the loops it guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube.events import micro_time
from gpuwarden.kube.metrics import kube_metrics
from gpuwarden.kube.resources import LEASES, JsonObject, Resource, resource_version
from gpuwarden.transient import Episodes

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpuwarden.litemetrics import Registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseDurations:
    """client-go's defaults: lease 15 s, renew deadline 10 s, retry period 2 s."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    jitter: float = 1.2

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.jitter * self.retry_period > 0:
            raise ValueError(
                "need lease_duration > renew_deadline > jitter * retry_period > 0 (as client-go)"
            )


@dataclass(frozen=True)
class LeaseSnapshot:
    """The Lease as last read, plus when (our monotonic clock) its record was first seen in this form."""

    holder: str
    lease_duration_seconds: int
    transitions: int
    acquire_time: str | None
    renew_time: str | None
    resource_version: str
    observed_at: float
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The Lease's metadata annotations (what the holder advertises there, e.g. its extender URL)."""


class LeaseAction(StrEnum):
    CREATE = "create"  # no Lease yet: create it holding it
    ACQUIRE = "acquire"  # free (released or expired): take it over
    RENEW = "renew"  # ours: renew it
    WAIT = "wait"  # someone else holds a live lease


def snapshot_of(lease: JsonObject, previous: LeaseSnapshot | None, now: float) -> LeaseSnapshot:
    """Read a Lease; `observed_at` moves to `now` only when the record changed since `previous`."""
    spec = lease.get("spec") or {}
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    snap = LeaseSnapshot(
        holder=str(spec.get("holderIdentity") or ""),
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        resource_version=resource_version(lease),
        observed_at=now,
        annotations={str(k): str(v) for k, v in annotations.items()},
    )
    if previous is not None and _record(previous) == _record(snap):
        return replace(snap, observed_at=previous.observed_at)
    return snap


def _record(s: LeaseSnapshot) -> tuple[object, ...]:
    return (s.holder, s.lease_duration_seconds, s.transitions, s.acquire_time, s.renew_time)


def decide_lease(
    snapshot: LeaseSnapshot | None, identity: str, now: float, durations: LeaseDurations
) -> LeaseAction:
    """What a candidate called `identity` should do at monotonic time `now`."""
    if snapshot is None:
        return LeaseAction.CREATE
    if snapshot.holder == identity:
        return LeaseAction.RENEW
    if not snapshot.holder:
        return LeaseAction.ACQUIRE
    if now >= snapshot.observed_at + snapshot.lease_duration_seconds:
        return LeaseAction.ACQUIRE
    return LeaseAction.WAIT


def lease_spec(
    action: LeaseAction,
    snapshot: LeaseSnapshot | None,
    identity: str,
    wall: datetime,
    durations: LeaseDurations,
) -> JsonObject:
    """The Lease `spec` to write for `action` (CREATE, ACQUIRE or RENEW)."""
    stamp = micro_time(wall)
    transitions = snapshot.transitions if snapshot is not None else 0
    acquire = stamp
    if action is LeaseAction.RENEW and snapshot is not None and snapshot.acquire_time:
        acquire = snapshot.acquire_time
    elif action is LeaseAction.ACQUIRE and snapshot is not None and snapshot.holder != identity:
        transitions += 1
    elif action is LeaseAction.WAIT:
        raise ValueError("nothing to write while another candidate holds the lease")
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, round(durations.lease_duration)),
        "acquireTime": acquire,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }


def release_spec(snapshot: LeaseSnapshot, wall: datetime) -> JsonObject:
    """client-go's release record: no holder and a 1 s duration, so the next candidate takes over at once."""
    stamp = micro_time(wall)
    return {
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": snapshot.transitions,
    }


def should_step_down(last_renewed: float, now: float, durations: LeaseDurations) -> bool:
    """A leader that could not renew within `renew_deadline` must stop leading."""
    return now - last_renewed >= durations.renew_deadline


class LeaseClient(Protocol):
    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> JsonObject: ...
    async def create(
        self, resource: Resource, body: JsonObject, *, namespace: str | None = None, dry_run: bool = False
    ) -> JsonObject: ...
    async def replace(
        self,
        resource: Resource,
        name: str,
        body: JsonObject,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObject: ...


Callback = Callable[[], Awaitable[None] | None]


class LeaderElector:
    """Competes for Lease `namespace/name` as `identity`; `run()` until `stop()` or cancellation."""

    def __init__(
        self,
        client: LeaseClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        durations: LeaseDurations | None = None,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        registry: CollectorRegistry | Registry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._annotations = dict(annotations or {})
        """Written into the Lease's metadata with every write of ours (what the holder advertises)."""
        self.name, self.namespace, self.identity = name, namespace, identity
        self.durations = durations or LeaseDurations()
        self._on_started, self._on_stopped = on_started_leading, on_stopped_leading
        self._monotonic, self._wall = monotonic, wall
        metrics = kube_metrics(registry)
        label = f"{namespace}/{name}"
        self._gauge = metrics.leader.labels(label)
        self._transitions = metrics.leader_transitions.labels(label)
        self._episodes = Episodes(metrics.transient_failures, log)
        self._gauge.set(0)
        self.is_leader = asyncio.Event()
        self.observed: LeaseSnapshot | None = None
        self._last_renewed = 0.0
        self.acquired_rv = ""
        """The resourceVersion of the write that made us leader this time (every write a predecessor made
        while leading came before it)."""
        self._fence = 0.0
        """Monotonic time until which our last successful write keeps us safely the only leader."""
        self._stopping = asyncio.Event()

    @property
    def leader(self) -> str:
        """The holder identity last observed ("" when free or unknown)."""
        return self.observed.holder if self.observed is not None else ""

    def fenced(self) -> bool:
        """Whether we lead *and* no other candidate can have taken the Lease yet, on our own clock.

        Stricter than `is_leader` (cleared only at the next step): our write committed after the step
        began, a standby takes over no sooner than `lease_duration` after it saw that write, so until
        `renew_deadline` after the step began nobody else leads - with `lease_duration - renew_deadline`
        (5 s by default) to spare for a request we started just before."""
        return self.is_leader.is_set() and self._monotonic() < self._fence

    @property
    def holder_annotations(self) -> Mapping[str, str]:
        """The annotations of the Lease as last read (the holder's advertisement), {} when unknown."""
        return self.observed.annotations if self.observed is not None else {}

    def _metadata(self, lease: JsonObject | None) -> JsonObject:
        """The metadata to write: the Lease's as read, with our annotations over its own."""
        metadata: JsonObject = dict((lease or {}).get("metadata") or {"name": self.name})
        if self._annotations:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **self._annotations}
        return metadata

    async def try_acquire_or_renew(self) -> bool:
        """One election step: read the Lease, decide, write conditionally. True when we hold it now."""
        now = self._monotonic()
        try:
            lease: JsonObject | None = await self._client.get(LEASES, self.name, namespace=self.namespace)
        except KubeNotFound:
            lease = None
        self.observed = snapshot_of(lease, self.observed, now) if lease is not None else None
        action = decide_lease(self.observed, self.identity, now, self.durations)
        if action is LeaseAction.WAIT:
            return False
        spec = lease_spec(action, self.observed, self.identity, self._wall(), self.durations)
        try:
            if lease is None:
                body = {"apiVersion": LEASES.api_version, "kind": "Lease", "metadata": self._metadata(None)}
                written = await self._client.create(LEASES, body | {"spec": spec}, namespace=self.namespace)
            else:
                body = lease | {"metadata": self._metadata(lease), "spec": spec}
                written = await self._client.replace(LEASES, self.name, body, namespace=self.namespace)
        except KubeConflict:  # another candidate wrote first; re-read on the next step
            return False
        self.observed = snapshot_of(written, None, self._monotonic())
        self._fence = now + self.durations.renew_deadline
        return True

    async def _set_leader(self, leading: bool) -> None:
        if not leading:
            self._fence = 0.0
        if leading == self.is_leader.is_set():
            return
        self._transitions.inc()
        self._gauge.set(1 if leading else 0)
        (self.is_leader.set if leading else self.is_leader.clear)()
        log.info(
            "started leading" if leading else "stopped leading",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )
        callback = self._on_started if leading else self._on_stopped
        if callback is not None:
            result = callback()
            if inspect.isawaitable(result):
                await result

    async def step(self) -> None:
        """One iteration of the loop (acquire/renew, then step down if the renew deadline passed)."""
        try:
            async with asyncio.timeout(self.durations.renew_deadline):
                held = await self.try_acquire_or_renew()
        except (KubeError, TimeoutError) as exc:
            if not self._episodes.failed("leader-election", exc):
                log.warning("lease step failed", extra={"lease": self.name, "error": str(exc)})
            held = False
        else:
            self._episodes.succeeded("leader-election")
        now = self._monotonic()
        if held:
            self._last_renewed = now
            if not self.is_leader.is_set() and self.observed is not None:
                self.acquired_rv = self.observed.resource_version
            await self._set_leader(True)
        elif self.is_leader.is_set():
            taken = bool(self.leader) and self.leader != self.identity
            if taken or should_step_down(self._last_renewed, now, self.durations):
                await self._set_leader(False)

    async def run(self) -> None:
        """Elect and renew until `stop()` or cancellation; then release the Lease if we hold it."""
        self._stopping.clear()
        try:
            while not self._stopping.is_set():
                await self.step()
                period = self.durations.retry_period
                if not self.is_leader.is_set():
                    period *= 1.0 + (self.durations.jitter - 1.0) * random.random()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=period)
        finally:
            if self.is_leader.is_set():
                await self.release()

    def stop(self) -> None:
        """Ask `run()` to release the Lease and return."""
        self._stopping.set()

    async def release(self) -> bool:
        """Give the Lease up if we hold it (conditional write); True when released."""
        released = False
        try:
            async with asyncio.timeout(self.durations.renew_deadline):
                lease = await self._client.get(LEASES, self.name, namespace=self.namespace)
                snap = snapshot_of(lease, None, self._monotonic())
                if snap.holder == self.identity:
                    body = lease | {"spec": release_spec(snap, self._wall())}
                    await self._client.replace(LEASES, self.name, body, namespace=self.namespace)
                    released = True
        except (KubeError, TimeoutError) as exc:
            log.warning("lease release failed", extra={"lease": self.name, "error": str(exc)})
        await self._set_leader(False)
        return released
