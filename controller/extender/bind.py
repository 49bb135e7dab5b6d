"""The bind verb's I/O: claim the exact GPU set on the pod, verify nobody else holds it, then bind.

Why it exists: kube-scheduler hands binding to us (`bindVerb`), so we must record `gpuwarden.io/gpu-ids` and
`gpuwarden.io/numa-node` *before* the pods/binding call, never assign a GPU twice under concurrent binding
cycles or between replicas, and stay correct after a restart. The protocol is in claims.py; this module runs
it: read the pod (from the watch cache when it has it unbound with the same UID, else a live GET; the
claim's resourceVersion precondition catches a stale cache and the bind starts over with a GET), choose from
the model plus this replica's own in-flight claims and record the choice as a new in-flight claim in one
step with no await in between (so concurrent binds in this replica never pick overlapping GPUs, and no
lock is held across a round trip; when the model finds no set, e.g. it has not yet seen preemption victims
go, choose again from a consistent LIST of the node's claims), a resourceVersion-conditioned patch, a look
for another replica's overlapping claim (in the watch cache once the pod watch shows our claim, else a
consistent LIST), then the Binding. A failed bind withdraws its
claim (only if the pod is still as we left it) so GPUs are not pinned.

Every bind carries a deadline (admission.py: the scheduler's httpTimeout, less a margin): past it, the bind
is cancelled before its next write - the claim PATCH or the Binding - its in-flight claim dropped and a
written claim withdrawn, so its GPUs are free and no Binding is posted after the scheduler stopped waiting.
A bind of a pod whose bind is still running joins that one; one that cannot finish in time at the current
bind rate is refused at once (`BindOutcome.cause` deadline, shed).

It decides nothing itself (`choose_gpus` does) and reports failures as `BindOutcome.error` text for the
scheduler; `KubeError`s never escape. In dry-run it binds without writing the claim.

The sole binder (`extender.bind_protocol: leader`, given a `SoleBinder`): while this replica is the fenced
holder of the Lease, nobody else writes GPU sets, so bind chooses (model plus in-flight claims, as above)
and writes the set on the Binding itself - one write, no claim PATCH, no verify. Until its pod watch has
passed the write that made it leader (a predecessor's last binds may still be on their way), it chooses
from a consistent LIST of the node's pods instead. Not the fenced holder, it refuses (the service forwards
bind to the holder before it gets here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Protocol, cast

from controller.extender.admission import BindRate, admit, deadline_of
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.claims import (
    binding_annotations,
    claim_patch,
    claim_selector,
    conflicts,
    release_patch,
    reusable_claim,
)
from controller.gpus.fit import Choice, Policy, Settings, choose_gpus, policy_of
from controller.gpus.model import Claim, ClusterModel
from controller.gpus.objects import JsonObject, PodInfo, pod_info
from controller.gpus.placement import alignment
from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube import PODS, KubeClient, PatchType

log = logging.getLogger(__name__)


class PodApi(Protocol):
    """The API calls bind needs; `KubePodApi` makes them, tests use an in-memory fake. The sole binder
    also calls `list_node_pods` and passes `annotations` to `bind_pod` (the claim protocol never does)."""

    async def get_pod(self, namespace: str, name: str) -> JsonObject: ...
    async def patch_pod(self, namespace: str, name: str, patch: JsonObject) -> JsonObject: ...
    async def list_pods(self, label_selector: str) -> list[JsonObject]: ...
    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class SolePodApi(PodApi, Protocol):
    """`PodApi` with the sole binder's two extras: a LIST by node name, and a Binding with annotations."""

    async def list_node_pods(self, node: str) -> list[JsonObject]: ...
    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None: ...


class SoleBinder(Protocol):
    """Whether this replica is the one binder now (`LeaderElector.fenced`), and which write made it so."""

    def fenced(self) -> bool: ...
    @property
    def acquired_rv(self) -> str: ...


class AlwaysSole:
    """The sole binder without an election (leader election off: a single replica)."""

    acquired_rv = ""

    def fenced(self) -> bool:
        return True


class KubePodApi:
    """`PodApi` over `gpuwarden.kube.KubeClient` (merge patches; LIST is a consistent read)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def get_pod(self, namespace: str, name: str) -> JsonObject:
        return await self._client.get(PODS, name, namespace=namespace)

    async def patch_pod(self, namespace: str, name: str, patch: JsonObject) -> JsonObject:
        return await self._client.patch(PODS, name, patch, patch_type=PatchType.MERGE, namespace=namespace)

    async def list_pods(self, label_selector: str) -> list[JsonObject]:
        return (await self._client.list_objects(PODS, label_selector=label_selector)).items

    async def list_node_pods(self, node: str) -> list[JsonObject]:
        return (await self._client.list_objects(PODS, field_selector=f"spec.nodeName={node}")).items

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        metadata: JsonObject = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = annotations  # copied onto the pod in the bind's write
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._client.request(
            "POST", PODS.path(namespace, name, "binding"), verb="create", resource="pods/binding",
            body=body, content_type="application/json",
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """`error` is "" on success; `kind` (for logs): bound, already_bound, rejected, conflict, error.

    `cause` says why a bind failed (pod_gone, pod_replaced, bound_elsewhere, no_fit, gpu_claimed,
    pod_changed, api_error, not_synced, deadline: cancelled before a write past its deadline, shed: refused
    at once, too many binds ahead of it to finish in time); `policy` is the pod's effective topology policy
    once known."""

    kind: str
    error: str = ""
    choice: Choice | None = None
    cause: str = ""
    policy: str = ""
    would_fail: str = ""
    """Dry-run only: the error a real run would have returned (the pod was bound anyway, unclaimed)."""
    dra_class: str = ""
    """The node is DRA-backed (controller/gpus/dra.py): bound as asked, no GPU set chosen or recorded."""
    passthrough: str = ""
    """Why the node was bound as asked without a GPU set (DRA-backed or shared GPUs; the view's reason)."""


def _revision(resource_version: str) -> int:
    """A resourceVersion as a number (etcd's revision; comparable, KEP-5504), -1 when it is not one."""
    return int(resource_version) if resource_version.isdigit() else -1


def _shows(seen: PodInfo, node: str, claim: Claim) -> bool:
    """Whether the watch's `seen` pod carries `claim` on `node`: bound there, or this very claim (same
    claimed-at, to the annotation's millisecond; an older claim of the pod with the same GPUs is not it)."""
    if seen.node_name:
        return seen.node_name == node
    if seen.claim_node != node or seen.claimed_at is None or claim.claimed_at is None:
        return False
    return abs(seen.claimed_at - claim.claimed_at) < 0.001


class Binder:
    """Runs the claim-verify-bind protocol; one per process, shared by all bind requests."""

    def __init__(
        self,
        api: PodApi,
        model: ClusterModel,
        settings: Callable[[], Settings],
        *,
        clock: Callable[[], float] = time.time,
        attempts: int = 3,
        dry_run: bool = False,
        on_conflict: Callable[[str], None] = lambda kind: None,
        watch_timeout: float = 0.0,
        on_phase: Callable[[str, float], None] = lambda phase, seconds: None,
        sole: SoleBinder | None = None,
        http_timeout: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        on_overload: Callable[[str], None] = lambda action: None,
    ) -> None:
        self._api = api
        self._http_timeout = http_timeout
        """The scheduler's httpTimeout: each bind's deadline is `deadline_of` its arrival (admission.py)."""
        self._monotonic = monotonic
        self._on_overload = on_overload
        """Told `cancelled` (a bind passed its deadline), `shed` (refused at once), `joined` (a retry
        joined the running bind of its pod)."""
        self._running: dict[str, tuple[str, asyncio.Future[BindOutcome]]] = {}
        """Per pod UID: the node and task of the bind running for it (a retry joins it)."""
        self._rate = BindRate()
        self._sole = sole
        """None: the claim protocol (any number of binders). Else bind only while `sole.fenced()`."""
        self._seen_rv = -1
        """The newest resourceVersion the pod watch delivered (tracked for the sole binder only): until it
        passes the Lease write that made this replica the binder (`sole.acquired_rv`), a predecessor's last
        binds may not be in the cache yet, so bind chooses from a consistent LIST."""
        self._model = model
        self._settings = settings
        self._clock = clock
        self._attempts = attempts
        self._dry_run = dry_run
        self._on_conflict = on_conflict
        self._watch_timeout = watch_timeout
        """How long a bind waits for the pod watch to show its claim before verifying with a LIST (0: never
        waits, always LISTs). Needs `pod_seen` wired to the feed."""
        self._on_phase = on_phase
        """Told how long each step took when it succeeded: claim (PATCH), verify (`_holders`), binding."""
        self._waiting: dict[str, list[tuple[str, Claim, asyncio.Future[None]]]] = {}
        self._inflight: dict[str, dict[str, Claim]] = {}
        self._known: set[str] = set()
        """Pods with an in-flight claim that the model had when the claim was noted."""

    @property
    def leader_protocol(self) -> bool:
        """Whether this binder runs the leader protocol (binds only as the fenced Lease holder)."""
        return self._sole is not None

    def has_inflight(self) -> bool:
        """Whether this replica has any in-flight claim (else `overlay` is empty for every node)."""
        return any(self._inflight.values())

    def inflight_nodes(self) -> Collection[str]:
        """The nodes `overlay` may return claims for (a live view: no other node has any)."""
        return self._inflight.keys()

    def overlay(self, node: str) -> list[Claim]:
        """This replica's claims on `node` that the watch has not delivered yet (expired ones dropped).

        A claim whose pod the model had and no longer has is dropped too: the model keeps every live GPU
        pod, pending ones included, so the pod is gone (typically a preemption victim deleted before the
        watch showed its claim; kept, the claim would block its GPUs for the whole TTL)."""
        claims = self._inflight.get(node)
        if not claims:
            return []
        ttl, now = self._settings().claim_ttl_seconds, self._clock()
        for key, claim in list(claims.items()):
            seen = self._model.pod(key)
            observed = seen is not None and seen.gpu_ids == claim.ids and _shows(seen, node, claim)
            gone = seen is None and key in self._known
            if observed or gone or claim.claimed_at is None or now - claim.claimed_at >= ttl:
                del claims[key]
                self._known.discard(key)
        if not claims:
            del self._inflight[node]  # keeps `has_inflight` a scan of live claims only
        return list(claims.values())

    def pod_seen(self, key: str) -> None:
        """The feed applied a watch event of pod `key`: wake the binds waiting to see their claim on it."""
        if self._sole is not None:  # a watch delivers in order: every write up to this one is applied
            seen = self._model.pod(key)
            if seen is not None:
                self._seen_rv = max(self._seen_rv, _revision(seen.resource_version))
        waiters = self._waiting.get(key)
        if not waiters:
            return
        seen = self._model.pod(key)
        if seen is None:
            return
        for node, claim, done in waiters:
            if not done.done() and seen.gpu_ids == claim.ids and _shows(seen, node, claim):
                done.set_result(None)

    async def _watch_shows(self, node: str, claim: Claim) -> bool:
        """Whether the pod watch delivered `claim` within the timeout."""
        seen = self._model.pod(claim.pod)
        if seen is not None and seen.gpu_ids == claim.ids and _shows(seen, node, claim):
            return True
        entry = (node, claim, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(claim.pod, []).append(entry)
        try:
            await asyncio.wait_for(entry[2], self._watch_timeout)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiting.get(claim.pod, [])
            if entry in waiters:
                waiters.remove(entry)
            if not waiters:
                self._waiting.pop(claim.pod, None)

    async def _holders(self, node: str, claim: Claim) -> list[PodInfo]:
        """The pods that may hold GPUs on `node`, as of a moment after `claim` was written.

        From the watch cache once it shows the claim: a watch delivers changes in the order they were
        written, so every claim written before ours is in the cache by then - the same guarantee as a
        consistent LIST, without the request. When the watch lags past the timeout: a consistent LIST.
        This relies on the feed's pod watch covering every namespace and label (it has a phase filter
        only) and on a relist being applied without an await between its objects (`Informer`); a
        filtered feed would need the LIST."""
        if self._watch_timeout > 0 and claim.claimed_at is not None:  # without a time, no write to wait for
            if await self._watch_shows(node, claim):
                return self._model.pods_on(node)
            self._on_conflict("watch_lag")
        listed = await self._api.list_pods(claim_selector(node))
        return [pod_info(o, self._model.resource) for o in listed]

    def _forget(self, node: str, key: str) -> None:
        claims = self._inflight.get(node)
        if claims is not None:
            claims.pop(key, None)
            if not claims:
                del self._inflight[node]
        self._known.discard(key)

    def _drop(self, node: str, claim: Claim, prior: Claim | None) -> None:
        """Forget `claim` if it is still the pod's in-flight entry, putting back the `prior` one it replaced
        (a concurrent bind of the same pod, e.g. the scheduler's retry, whose claim may have been written)."""
        if self._inflight.get(node, {}).get(claim.pod) is not claim:
            return
        if prior is None:
            self._forget(node, claim.pod)
        else:
            self._inflight[node][claim.pod] = prior

    def _cached(self, args: ExtenderBindingArgs) -> PodInfo | None:
        """The pod from the watch cache when bind may act on it without a GET: same UID, unbound, asking
        for GPUs and without a claim of its own to reuse (reuse writes nothing, so it must start from a
        live read). The claim patch carries its resourceVersion: a stale cache ends in a 409, then a GET."""
        pod = self._model.pod(f"{args.pod_namespace}/{args.pod_name}")
        if self._dry_run or pod is None or pod.uid != args.pod_uid or pod.node_name or pod.gpus <= 0:
            return None
        if not pod.resource_version:
            return None
        settings = self._settings()
        if reusable_claim(pod, args.node, self._clock(), settings.claim_ttl_seconds) is not None:
            return None
        return pod

    def running(self) -> int:
        """Binds running now (joined retries not counted)."""
        return len(self._running)

    async def bind(self, args: ExtenderBindingArgs) -> BindOutcome:
        """Bind as the scheduler asked, within the scheduler's patience: join the running bind of the same
        pod, refuse what cannot finish in time, else bind with a deadline (see the module docstring)."""
        now = self._monotonic()
        deadline = deadline_of(now, self._http_timeout)
        key = args.pod_uid or f"{args.pod_namespace}/{args.pod_name}"
        running = self._running.get(key)
        if running is not None:
            joined = await self._join(args, running, deadline)
            if joined is not None:
                return joined
            now = self._monotonic()
        if not admit(len(self._running), self._rate.rate(now), deadline - now):
            self._on_overload("shed")
            return BindOutcome(
                "error",
                f"gpuwarden extender: too many binds in flight to bind {args.pod_namespace}/{args.pod_name} "
                "before the scheduler's timeout; retry",
                cause="shed",
            )
        self._rate.started(now, len(self._running))
        task = asyncio.ensure_future(self._bind(args, deadline))
        self._running[key] = (args.node, task)

        def done(_: asyncio.Future[BindOutcome]) -> None:
            if self._running.get(key, ("", None))[1] is task:
                del self._running[key]
            self._rate.finished(self._monotonic())

        task.add_done_callback(done)
        return await asyncio.shield(task)  # the scheduler hanging up does not cut a bind between its steps

    async def _join(
        self, args: ExtenderBindingArgs, running: tuple[str, asyncio.Future[BindOutcome]], deadline: float
    ) -> BindOutcome | None:
        """Wait for the running bind of the same pod (a retry of the scheduler, or another replica's
        forward): its outcome for the same node (as `already_bound` when it bound, so the pod's Event and
        placement are counted once), or None when this one must bind itself (it was cancelled, or it was
        for another node and is over)."""
        node, task = running
        self._on_overload("joined")
        try:
            async with asyncio.timeout(max(0.0, deadline - self._monotonic())):
                outcome = await asyncio.shield(task)
        except TimeoutError:
            return BindOutcome(
                "error",
                f"the bind of {args.pod_namespace}/{args.pod_name} to {node} is still running; retry",
                cause="deadline",
            )
        if outcome.cause == "deadline" or node != args.node:
            return None  # nothing written for it (cancelled), or the pod's state decides (bound_elsewhere)
        return replace(outcome, kind="already_bound") if outcome.kind == "bound" else outcome

    def _late(self, deadline: float) -> bool:
        return self._monotonic() >= deadline

    def _cancelled(self, key: str, node: str) -> BindOutcome:
        self._on_overload("cancelled")
        return BindOutcome(
            "error",
            f"bind of {key} to {node} passed its deadline ({self._http_timeout:g} s httpTimeout) before the "
            "Binding: cancelled, its GPUs freed; retry",
            cause="deadline",
        )

    async def _bind(self, args: ExtenderBindingArgs, deadline: float) -> BindOutcome:
        ns, name, node = args.pod_namespace, args.pod_name, args.node
        try:
            cached, tries = self._cached(args), 0
            while tries < self._attempts:
                outcome = await self._attempt(args, cached, deadline)
                if outcome is not None:
                    return outcome
                self._on_conflict("pod_changed")
                if cached is None:  # a stale cache costs no attempt: the next try reads the pod live
                    tries += 1
                cached = None
            return BindOutcome(
                "conflict",
                f"pod {ns}/{name} kept changing while binding it to {node}; retry",
                cause="pod_changed",
            )
        except KubeError as exc:
            log.warning("bind failed", extra={"pod": f"{ns}/{name}", "node": node, "error": str(exc)})
            return BindOutcome(
                "error", f"binding {ns}/{name} to {node} failed: {exc.message}", cause="api_error"
            )

    async def _attempt(
        self, args: ExtenderBindingArgs, cached: PodInfo | None, deadline: float
    ) -> BindOutcome | None:
        """One try, from `cached` (see `_cached`) or a live GET; None means the pod changed under us (409)
        and the caller should start over."""
        ns, name, node = args.pod_namespace, args.pod_name, args.node
        if cached is not None:
            pod = cached
        else:
            try:
                pod = pod_info(await self._api.get_pod(ns, name), self._model.resource)
            except KubeNotFound:
                return BindOutcome("error", f"pod {ns}/{name} not found", cause="pod_gone")
            if pod.uid != args.pod_uid:
                return BindOutcome(
                    "error", f"pod {ns}/{name} has UID {pod.uid}, not {args.pod_uid}", cause="pod_replaced"
                )
            if pod.node_name:
                if pod.node_name == node:
                    return BindOutcome("already_bound")
                return BindOutcome(
                    "error", f"pod {ns}/{name} is already bound to {pod.node_name}", cause="bound_elsewhere"
                )
            if pod.gpus <= 0:
                if self._late(deadline):
                    return self._cancelled(pod.key, node)
                await self._api.bind_pod(ns, name, pod.uid, node)
                return BindOutcome("bound")
        view = self._model.view(node)
        if view is not None and view.passthrough:
            # DRA has allocated the devices already (its PreBind runs before an extender's bind), or the
            # node shares its GPUs and its device plugin picks the replicas: a set chosen here would be
            # fiction, so none is recorded.
            if self._late(deadline):
                return self._cancelled(pod.key, node)
            await self._api.bind_pod(ns, name, pod.uid, node)
            return BindOutcome("bound", dra_class=view.dra_class, passthrough=view.passthrough)
        if cached is None and self._dry_run:
            return await self._bind_dry(pod, node, deadline)
        if self._sole is not None:
            return await self._bind_sole(pod, node, self._sole, deadline)
        claimed = await self._claim(pod, node, deadline)
        if not isinstance(claimed, tuple):
            return claimed
        choice, rv = claimed
        return await self._finish(pod, node, choice, rv, deadline)

    async def _bind_dry(self, pod: PodInfo, node: str, deadline: float) -> BindOutcome:
        """Dry-run: decide as a real run would (a consistent read when the cache finds no set), write no
        claim, bind; what a real run would have refused is reported in `would_fail`."""
        chosen = self._choose(pod, node)
        if chosen.choice is None:
            self._on_conflict("cache_stale")
            fresh = await self._api.list_pods(claim_selector(node))
            chosen = self._choose(pod, node, [pod_info(o, self._model.resource) for o in fresh])
        ns, name = pod.key.split("/", 1)
        if self._late(deadline):
            return self._cancelled(pod.key, node)
        await self._api.bind_pod(ns, name, pod.uid, node)
        if chosen.choice is None:
            log.info("dry-run: would fail", extra={"pod": pod.key, "node": node, "error": chosen.error})
            return BindOutcome("bound", cause=chosen.cause, policy=self._policy(pod), would_fail=chosen.error)
        log.info("dry-run: would claim GPUs", extra={"pod": pod.key, "node": node, "choice": chosen.choice})
        return BindOutcome("bound", choice=chosen.choice, policy=self._policy(pod))

    def _caught_up(self, sole: SoleBinder) -> bool:
        """Whether the pod cache holds every write made before this replica became the binder."""
        if not sole.acquired_rv:  # no election (a single replica): the cache is as good as a LIST
            return True
        barrier = _revision(sole.acquired_rv)
        return barrier >= 0 and self._seen_rv > barrier  # not a number: never assume it, always LIST

    async def _node_pods(self, node: str) -> list[PodInfo]:
        """A consistent read of every pod that may hold GPUs on `node`: bound there, or claiming it."""
        bound = await cast(SolePodApi, self._api).list_node_pods(node)
        claiming = await self._api.list_pods(claim_selector(node))
        pods = {p.key: p for p in (pod_info(o, self._model.resource) for o in [*bound, *claiming])}
        return list(pods.values())

    async def _bind_sole(self, pod: PodInfo, node: str, sole: SoleBinder, deadline: float) -> BindOutcome:
        """The sole binder's bind: choose, then one write - the Binding carrying the set."""
        if not sole.fenced():
            self._on_conflict("not_binder")
            return BindOutcome(
                "error",
                f"this replica is not the binder (bind of {pod.key} to {node}); retry",
                cause="not_binder",
            )
        settings, now = self._settings(), self._clock()
        listed = None if self._caught_up(sole) else await self._node_pods(node)
        ids = reusable_claim(pod, node, now, settings.claim_ttl_seconds)
        if ids is not None:  # the pod's own claim (a preemption's reservation, an earlier try): keep its set
            choice = self._describe(node, ids)
            holders = listed if listed is not None else self._model.pods_on(node)
            clash = conflicts(pod.key, node, ids, holders, now, settings.claim_ttl_seconds)
            clash += [
                (c.pod, c.ids) for c in self.overlay(node) if c.pod != pod.key and set(c.ids) & set(ids)
            ]
            if clash:
                self._on_conflict("gpu_claimed")
                held = "; ".join(f"GPU {','.join(gpu_ids)} by {key}" for key, gpu_ids in clash)
                return BindOutcome(
                    "conflict",
                    f"GPUs on {node} were claimed concurrently ({held}); retry",
                    cause="gpu_claimed",
                )
            mine = Claim(pod.key, ids, now)
            prior = self._note(node, mine)
        else:
            picked = self._pick(pod, node, now, listed)
            if isinstance(picked, BindOutcome) and listed is None:
                self._on_conflict("cache_stale")  # e.g. preemption victims deleted a moment ago
                picked = self._pick(pod, node, self._clock(), await self._node_pods(node))
            if isinstance(picked, BindOutcome):
                return picked
            choice, mine, prior = picked
        if not sole.fenced():  # a LIST took long enough for the fence to end: write nothing
            self._drop(node, mine, prior)
            self._on_conflict("not_binder")
            return BindOutcome(
                "error",
                f"this replica stopped being the binder while binding {pod.key}; retry",
                cause="not_binder",
            )
        if self._late(deadline):  # the safe point: nothing written yet
            self._drop(node, mine, prior)
            return self._cancelled(pod.key, node)
        ns, name = pod.key.split("/", 1)
        try:
            started = time.perf_counter()
            annotations = binding_annotations(node, choice, now)
            await cast(SolePodApi, self._api).bind_pod(ns, name, pod.uid, node, annotations)
            self._on_phase("binding", time.perf_counter() - started)
        except KubeConflict:
            self._drop(node, mine, prior)
            current = pod_info(await self._api.get_pod(ns, name), self._model.resource)
            if current.node_name == node:  # a concurrent try of the same pod won; its set is recorded
                return BindOutcome("already_bound", choice=self._describe(node, current.gpu_ids or ()))
            return BindOutcome(
                "error",
                f"pod {pod.key} could not be bound to {node}: it changed meanwhile",
                cause="pod_changed",
            )
        except KubeNotFound:
            self._drop(node, mine, prior)
            return BindOutcome("error", f"pod {pod.key} not found", cause="pod_gone")
        except KubeError as exc:
            if exc.status is not None and 400 <= exc.status < 500:  # refused: nothing was written
                self._drop(node, mine, prior)
            # else (unreachable, timed out, 5xx) the Binding may have been written: the in-flight claim
            # stays until the watch shows the pod, or it is gone, or the claim TTL passes
            raise
        return BindOutcome("bound", choice=choice, policy=self._policy(pod))

    def _choose(self, pod: PodInfo, node: str, listed: list[PodInfo] | None = None) -> BindOutcome:
        """The GPU set from the watch cache or, given `listed` (a consistent LIST), from fresh data.

        Strict: the allowance decide.py makes a nominated pod for GPUs its preemption is freeing does not
        apply here (the nomination is dropped), so bind only hands out GPUs nobody holds."""
        view = self._model.view(node) if listed is None else self._model.fresh_view(node, listed)
        if view is not None:
            # our in-flight claims win over what the cache shows for the same pod (an older claim of it)
            mine = [c for c in self.overlay(node) if c.pod != pod.key]
            keys = {c.pod for c in mine}
            if keys & {c.pod for c in view.claims}:
                view = replace(view, claims=tuple(c for c in view.claims if c.pod not in keys), memo={})
            view = view.with_claims(mine)
        verdict = choose_gpus(replace(pod, nominated=""), view, self._settings(), self._clock(), node=node)
        if verdict.choice is None:
            return BindOutcome(
                "rejected", f"no GPU set for {pod.key} on {node}: {verdict.reason}", cause="no_fit"
            )
        return BindOutcome("bound", choice=verdict.choice)

    def _pick(
        self, pod: PodInfo, node: str, now: float, listed: list[PodInfo] | None = None
    ) -> tuple[Choice, Claim, Claim | None] | BindOutcome:
        """Choose (see `_choose`) and note the set as this replica's in-flight claim, or why there is none.

        The critical section of concurrent binds to one node, kept synchronous on purpose: no await between
        reading the overlay and recording the claim, so the next chooser in this replica sees it and never
        picks an overlapping set, and no bind waits on another's round trips. The claim is noted before it
        is written, so filter and prioritize already count it while the bind runs (kube-scheduler assumed
        the pod on `node` and scores the next pod meanwhile; a burst is packed, not spread). Also returns the
        pod's in-flight claim this one replaces, if any."""
        chosen = self._choose(pod, node, listed)
        if chosen.choice is None:
            return chosen
        claim = Claim(pod.key, chosen.choice.ids, now)
        return chosen.choice, claim, self._note(node, claim)

    def _note(self, node: str, claim: Claim) -> Claim | None:
        """Record `claim` as this replica's in-flight claim of its pod on `node`; the one it replaces."""
        claims = self._inflight.setdefault(node, {})
        prior = claims.get(claim.pod)
        claims[claim.pod] = claim
        if self._model.pod(claim.pod) is not None:
            self._known.add(claim.pod)
        return prior

    def _describe(self, node: str, ids: tuple[str, ...]) -> Choice:
        """A `Choice` for a set claimed earlier (a retried bind reusing its own claim)."""
        view = self._model.view(node)
        gpus = [g for g in view.topology.gpus if g.id in ids] if view is not None else []
        numa = tuple(sorted({g.numa for g in gpus if g.numa is not None}))
        return Choice(ids, numa, alignment(gpus) if len(gpus) == len(ids) else "unknown", 0)

    async def _claim(
        self, pod: PodInfo, node: str, deadline: float
    ) -> tuple[Choice, str] | BindOutcome | None:
        """Write (or reuse) the claim and verify it; the claimed choice and the pod's new resourceVersion."""
        settings, now = self._settings(), self._clock()
        ids = reusable_claim(pod, node, now, settings.claim_ttl_seconds)
        rv = pod.resource_version
        if ids is not None:
            choice = self._describe(node, ids)
            mine = Claim(pod.key, ids, pod.claimed_at)
        else:
            picked = self._pick(pod, node, now)
            if isinstance(picked, BindOutcome):
                # The cache may lag (typically: preemption victims deleted a moment ago, the scheduler
                # already saw it and calls bind): decide again from a consistent read before giving up.
                self._on_conflict("cache_stale")
                fresh = await self._api.list_pods(claim_selector(node))
                now = self._clock()
                picked = self._pick(pod, node, now, [pod_info(o, self._model.resource) for o in fresh])
            if isinstance(picked, BindOutcome):
                return picked
            choice, mine, prior = picked
            if self._late(deadline):  # a safe point: nothing written yet
                self._drop(node, mine, prior)
                return self._cancelled(pod.key, node)
            try:
                ns, name = pod.key.split("/", 1)
                started = time.perf_counter()
                patched = await self._api.patch_pod(ns, name, claim_patch(node, choice, now, rv))
            except KubeConflict:
                self._drop(node, mine, prior)
                return None
            except KubeNotFound:
                self._drop(node, mine, prior)
                return BindOutcome("error", f"pod {pod.key} not found", cause="pod_gone")
            except BaseException:  # unwritten or unknown: the watch shows it if it was written
                self._drop(node, mine, prior)
                raise
            self._on_phase("claim", time.perf_counter() - started)
            rv = str((patched.get("metadata") or {}).get("resourceVersion", ""))
        try:
            started = time.perf_counter()
            others = await self._holders(node, mine)
            self._on_phase("verify", time.perf_counter() - started)
        except KubeError:
            await self._release(pod, node, rv)  # unverified: never bind on it
            raise
        clash = conflicts(pod.key, node, choice.ids, others, self._clock(), settings.claim_ttl_seconds)
        if clash:
            self._on_conflict("gpu_claimed")
            await self._release(pod, node, rv)
            held = "; ".join(f"GPU {','.join(gpu_ids)} by {key}" for key, gpu_ids in clash)
            log.info("bind lost a GPU race", extra={"pod": pod.key, "node": node, "held": held})
            return BindOutcome(
                "conflict", f"GPUs on {node} were claimed concurrently ({held}); retry", cause="gpu_claimed"
            )
        return choice, rv

    async def _finish(self, pod: PodInfo, node: str, choice: Choice, rv: str, deadline: float) -> BindOutcome:
        ns, name = pod.key.split("/", 1)
        if self._late(deadline):  # the safe point before the Binding: withdraw the claim, free the GPUs
            await self._release(pod, node, rv)
            return self._cancelled(pod.key, node)
        try:
            started = time.perf_counter()
            await self._api.bind_pod(ns, name, pod.uid, node)
            self._on_phase("binding", time.perf_counter() - started)
        except KubeConflict:
            current = pod_info(await self._api.get_pod(ns, name), self._model.resource)
            if current.node_name == node:
                return BindOutcome("already_bound", choice=choice)
            await self._release(pod, node, rv)
            return BindOutcome(
                "error",
                f"pod {pod.key} could not be bound to {node}: it changed meanwhile",
                cause="pod_changed",
            )
        except KubeError:
            await self._release(pod, node, rv)
            raise
        return BindOutcome("bound", choice=choice, policy=self._policy(pod))

    def _policy(self, pod: PodInfo) -> str:
        """The pod's effective topology policy, as text for events and logs."""
        policy = policy_of(pod, self._settings())
        return policy.value if isinstance(policy, Policy) else ""

    async def _release(self, pod: PodInfo, node: str, rv: str) -> None:
        """Withdraw our claim, only if nobody touched the pod since we wrote it (else it is not ours)."""
        self._forget(node, pod.key)
        patch = release_patch()
        patch["metadata"]["resourceVersion"] = rv
        try:
            ns, name = pod.key.split("/", 1)
            await self._api.patch_pod(ns, name, patch)
        except KubeError as exc:  # the claim then expires after its TTL
            log.info("claim not withdrawn", extra={"pod": pod.key, "node": node, "error": str(exc)})
