"""The extender's HTTP edge: `POST <prefix>/filter`, `/prioritize`, `/preempt`, `/bind` for kube-scheduler.

Why it exists: to turn the wire format into calls of the pure core and back, and to own the error contract
kube-scheduler expects (reference/scheduler-extender.md section 1.10):

* a request we cannot parse -> HTTP 400 with a message naming the problem (the scheduler treats any non-200
  as an error of that verb);
* an internal failure or an unsynced cache -> HTTP 200 with `Error` set for filter and bind (the scheduling
  or binding cycle fails unless the extender is `ignorable`), HTTP 500 for prioritize (ignored: the
  extender adds no score) and preempt (PostFilter error); details go to the log, the answer stays generic;
* nodes are answered in the mode they were asked in: `NodeNames` for nodeCacheCapable, the untouched `Nodes`
  objects otherwise.

Mount it with `add_extender_routes(app, service, prefix)`; the controller process builds the service from
its model, binder and registry. It must not decide placements (decide.py) or talk to the API (bind.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from controller.extender import answers as node_answers
from controller.extender.answers import (
    AnswerCache,
    domain_prioritize_body,
    filter_body,
    job_answers,
    may_be_settling,
    pass_all,
    prioritize_body,
)
from controller.extender.bind import Binder, BindOutcome
from controller.extender.events import BindEvents, bind_event
from controller.extender.forward import FORWARDED_SUFFIX, Forwarder
from controller.extender.metrics import ExtenderMetrics
from controller.extenderv1 import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    NodeList,
)
from controller.gpus.domains import JobGroup, job_group, preferred_domains
from controller.gpus.fit import FleetSettings, Settings
from controller.gpus.model import Claim, ClusterModel, NodeView, NotSynced
from controller.gpus.objects import PodInfo, pod_info

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/gpu-extender"
MAX_BODY_BYTES = 64 << 20
"""A Nodes-mode request carries every candidate Node object (~5-20 KiB each): allow 500+ nodes."""
NOT_SYNCED = "gpuwarden extender: GPU topology cache not synced yet"
INTERNAL = "gpuwarden extender: internal error (details in the controller log)"
READ_PODS = 256
"""Pods kept read between a filter and its prioritize (cleared in bulk past this; a pod is re-read then)."""

PreemptHook = Callable[[ExtenderPreemptionArgs], Awaitable[ExtenderPreemptionResult]]
Args = TypeVar("Args", bound=BaseModel)


class Encodable(Protocol):
    """Every wire result: JSON bytes exactly as the scheduler expects them."""

    def to_json(self) -> bytes: ...


async def passthrough_preemption(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
    """The preempt verb when the preemption throttle is off: the scheduler's candidates, as UIDs."""
    return ExtenderPreemptionResult(node_name_to_meta_victims=args.meta_victims())


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response body already encoded (prioritize's fast path)."""

    body: bytes

    def to_json(self) -> bytes:
        return self.body


class ExtenderService:
    """The four verbs over one `ClusterModel`; `binder` None means bind answers with an error."""

    def __init__(
        self,
        model: ClusterModel,
        settings: Settings,
        metrics: ExtenderMetrics,
        *,
        binder: Binder | None = None,
        preempt_hook: PreemptHook = passthrough_preemption,
        clock: Callable[[], float] = time.time,
        settle_seconds: float = 0.3,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        events: BindEvents | None = None,
        fleet: FleetSettings | None = None,
    ) -> None:
        self.model = model
        self.events = events
        """Where bind outcomes go as Kubernetes Events (None: no Events); `offer` never blocks."""
        self.settle_seconds = settle_seconds
        self._sleep = sleep
        self.fleet = fleet if fleet is not None else FleetSettings(settings, model.max_numa_gpus)
        """The settings every capability asks the model with (`controller.gpus.fit.FleetSettings`)."""
        self.metrics = metrics
        self.binder = binder
        self.preempt_hook = preempt_hook
        self.clock = clock
        self.max_body_bytes = MAX_BODY_BYTES
        self.forwarder: Forwarder | None = None
        """With the leader bind protocol: where bind goes while this replica is not the fenced binder."""
        self.is_binder: Callable[[], bool] = lambda: True
        """Whether this replica binds itself now (always, under the claim protocol)."""
        self._overlays: dict[str, tuple[NodeView, tuple[Claim, ...], NodeView]] = {}
        """Per node: (model view, this replica's in-flight claims there, the view with them). Kept while
        both are unchanged, so decide.py's answers cached on it serve the next requests too (filter then
        prioritize of one pod, and the pods after it) instead of being rebuilt per request."""
        self._read_pods: dict[tuple[str, str], PodInfo] = {}
        """The pods of the last requests, read (`pod_info`) by UID and resourceVersion: prioritize gets the
        same pod its filter got."""
        self.answers = AnswerCache()
        """Pre-encoded answers per node and request shape (answers.py), dropped with their node's view."""
        model.add_change_listener(self.answers.forget)

    @property
    def settings(self) -> Settings:
        """The configured knobs (without the fleet-derived NUMA size)."""
        return self.fleet.base

    @settings.setter
    def settings(self, value: Settings) -> None:
        self.fleet.base = value

    def current_settings(self) -> Settings:
        """Settings with the fleet-derived NUMA size filled in (the same object while unchanged)."""
        return self.fleet()

    def _views(self, names: list[str]) -> list[tuple[str, NodeView | None]]:
        if not self.model.synced:
            raise NotSynced
        if self.binder is None or not self.binder.has_inflight():
            self._overlays.clear()
            return self.model.views_of(names)
        overlay, overlays, inflight = self.binder.overlay, self._overlays, self.binder.inflight_nodes()
        out: list[tuple[str, NodeView | None]] = []
        for name, view in self.model.views_of(names):
            if view is not None and name in inflight:
                extra = tuple(overlay(name))
                if extra:
                    kept = overlays.get(name)
                    if kept is not None and kept[0] is view and kept[1] == extra:
                        view = kept[2]
                    else:
                        overlays[name] = (view, extra, overlaid := view.with_claims(extra))
                        view = overlaid
            out.append((name, view))
        if len(overlays) > 2 * len(inflight) + 64:  # nodes whose claims settled since: drop them in bulk
            for name in [n for n in overlays if n not in inflight]:
                del overlays[name]
        return out

    def _view(self, name: str) -> NodeView | None:
        """One node's view as `_views` gives it (with this replica's in-flight claims)."""
        return self._views([name])[0][1]

    def _hot(self, pod: PodInfo, names: list[str]) -> set[str]:
        """The candidates whose answers must be derived for this request: nodes with this replica's in-flight
        claims (their views are overlaid) and the node the pod is nominated to."""
        hot: set[str] = set()
        if self.binder is not None and self.binder.has_inflight():
            hot = self.binder.inflight_nodes() & names  # type: ignore[operator]
        else:
            self._overlays.clear()
        if pod.nominated:
            hot.add(pod.nominated)
        return hot

    def _answers(self, pod: PodInfo, names: list[str]) -> list[node_answers.Answer]:
        """Each candidate's answer (answers.py): the one way a filter or prioritize answer is derived,
        cached per node and request shape where it may be, else built for this request."""
        if not self.model.synced:
            raise NotSynced
        if pod.gpus <= 0:
            return pass_all(names)
        settings, now = self.current_settings(), self.clock()
        return self.answers.answers(pod, names, self._view, settings, now, self._hot(pod, names))

    def _pod(self, args: ExtenderArgs) -> PodInfo:
        """The pod as the scheduler sent it, read once for its filter and its prioritize (the same object,
        by UID and resourceVersion); its nomination from our watch when that copy has none yet (the
        scheduler patches `nominatedNodeName` asynchronously and may retry the preemptor before then)."""
        meta = args.pod.get("metadata") or {}
        key = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
        pod = self._read_pods.get(key) if all(key) else None
        if pod is None:
            pod = pod_info(args.pod, self.model.resource)
            if all(key):
                if len(self._read_pods) >= READ_PODS:
                    self._read_pods.clear()
                self._read_pods[key] = pod
        if not pod.nominated:
            cached = self.model.pod(pod.key)
            if cached is not None and cached.uid == pod.uid and cached.nominated and not pod.node_name:
                pod = dataclasses.replace(pod, nominated=cached.nominated)
        return pod

    async def filter(self, args: ExtenderArgs) -> ExtenderFilterResult | Encoded:
        if not self.model.synced:
            return ExtenderFilterResult(error=NOT_SYNCED)
        pod, names = self._pod(args), args.candidate_names()
        try:
            answers = self._answers(pod, names)
            if self.settle_seconds > 0 and may_be_settling(answers, pod.priority):
                # kube-scheduler retries a preemptor within milliseconds of deleting its victims; our watch
                # may not have delivered the deletions yet, and an extender rejection is not requeued by
                # them (the pod would wait for the 5-minute flush). Give the watch a moment, then answer.
                log.debug("filter waits for the watch", extra={"pod": pod.key})
                await self._sleep(self.settle_seconds)
                answers = self._answers(pod, names)
        except NotSynced:
            return ExtenderFilterResult(error=NOT_SYNCED)
        group = self._job_group(args, pod)
        if group is not None:  # a pod of a multi-pod job: never into a degraded NVLink domain
            answers = job_answers(answers, self.model.node_domain, group)
        body, counts = filter_body(pod, answers, self.current_settings(), self.clock())
        self._count_filtered(*counts)
        if (counts.failed or counts.unresolvable) and log.isEnabledFor(logging.DEBUG):
            log.debug("filter", extra={"pod": pod.key, "answer": body.decode()})
        if args.node_names is None and args.nodes is not None:  # Nodes mode: the passed Node objects back
            passed = {a.name for a in answers if a.passed}
            items = [n for n in args.nodes.items if (n.get("metadata") or {}).get("name") in passed]
            nodes = NodeList(metadata={}, items=items).to_json()
            body = b'{"Nodes":' + nodes + body.removeprefix(b'{"Nodes":null')
        return Encoded(body)

    def _count_filtered(self, passed: int, dra: int, failed: int, unresolvable: int, shared: int = 0) -> None:
        for label, count in (
            ("passed", passed),
            ("dra_passthrough", dra),
            ("failed", failed),
            ("unresolvable", unresolvable),
            ("shared_passthrough", shared),
        ):
            if count:
                self.metrics.filter_nodes.labels(label).inc(count)

    async def prioritize(self, args: ExtenderArgs) -> Encoded:
        pod = self._pod(args)
        answers = self._answers(pod, args.candidate_names())
        group = self._job_group(args, pod)
        if group is not None and self.model.placement is not None:  # toward its siblings' NVLink domain
            answers = job_answers(answers, self.model.node_domain, group)
            preferred = preferred_domains(self.model.sibling_domains(group))
            weight = self.model.placement.weight
            return Encoded(domain_prioritize_body(answers, self.model.node_domain, preferred, weight))
        return Encoded(prioritize_body(answers))

    def _job_group(self, args: ExtenderArgs, pod: PodInfo) -> JobGroup | None:
        """The multi-pod job a GPU pod belongs to (`domains.job_labels`), None without domain placement."""
        placement = self.model.placement
        if placement is None or pod.gpus <= 0:
            return None
        meta = args.pod.get("metadata") or {}
        return job_group(str(meta.get("namespace", "")), meta.get("labels") or {}, placement.job_labels)

    async def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        return await self.preempt_hook(args)

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        if self.forwarder is not None and not self.is_binder():
            result = await self.forwarder.bind(args)
            self.metrics.forwarded.labels("error" if result.error else "ok").inc()
            return result
        return await self.bind_here(args)

    async def bind_here(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Bind in this replica (a forwarded bind comes here directly: it is never passed on again)."""
        if self.binder is None:
            return ExtenderBindingResult(error="gpuwarden extender: bind is not enabled on this replica")
        if not self.model.synced:
            self._notify(args, BindOutcome("error", NOT_SYNCED, cause="not_synced"))
            return ExtenderBindingResult(error=NOT_SYNCED)
        outcome = await self.binder.bind(args)
        self._notify(args, outcome)
        if outcome.choice is not None and not outcome.error and outcome.kind == "bound":
            self.metrics.placements.labels(outcome.choice.alignment).inc()
        log.info(
            "bind",
            extra={
                "pod": f"{args.pod_namespace}/{args.pod_name}",
                "node": args.node,
                "outcome": outcome.kind,
                "gpus": ",".join(outcome.choice.ids) if outcome.choice else "",
                "error": outcome.error,
            },
        )
        return ExtenderBindingResult(error=outcome.error)

    def _notify(self, args: ExtenderBindingArgs, outcome: BindOutcome) -> None:
        if self.events is None:
            return
        self.events.offer(
            bind_event(
                args,
                kind=outcome.kind,
                error=outcome.error,
                cause=outcome.cause,
                choice=outcome.choice,
                policy=outcome.policy,
                dry_run=self.events.dry_run,
                would_fail=outcome.would_fail,
                dra_class=outcome.dra_class,
                passthrough=outcome.passthrough,
            )
        )


def _problem(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, up to `limit` bytes (aiohttp's own 1 MiB default is too small for Nodes-mode requests)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks)


Answer = tuple[int, bytes, str]
"""An HTTP answer: status, body (JSON, or text for a non-200) and the request outcome for the metrics."""


def _answerer(
    verb: str,
    parse: type[Args],
    call: Callable[[Args], Awaitable[Encodable]],
    on_error: Callable[[], Encodable] | None,
) -> Callable[[bytes], Awaitable[Answer]]:
    """One verb from request bytes to response bytes: parse, call, encode, and the error contract."""

    async def answer(raw: bytes) -> Answer:
        try:
            args = parse.model_validate_json(raw)
        except ValidationError as exc:
            return 400, f"malformed {parse.__name__}: {_problem(exc)}".encode(), "bad_request"
        try:
            result = await call(args)
        except NotSynced:
            return 503, NOT_SYNCED.encode(), "error"
        except Exception:
            log.exception("extender verb failed", extra={"verb": verb})
            if on_error is None:
                return 500, INTERNAL.encode(), "error"
            result = on_error()
            return 200, result.to_json(), "error"
        return 200, result.to_json(), "error" if getattr(result, "error", "") else "ok"

    return answer


def answerers(service: ExtenderService) -> dict[str, Callable[[bytes], Awaitable[Answer]]]:
    """Per verb, the request-bytes-to-answer function its route serves (the benchmarks call them too)."""
    verbs = {
        "filter": _answerer(
            "filter", ExtenderArgs, service.filter, lambda: ExtenderFilterResult(error=INTERNAL)
        ),
        "prioritize": _answerer("prioritize", ExtenderArgs, service.prioritize, None),
        "preempt": _answerer("preempt", ExtenderPreemptionArgs, service.preempt, None),
        "bind": _answerer(
            "bind", ExtenderBindingArgs, service.bind, lambda: ExtenderBindingResult(error=INTERNAL)
        ),
    }
    if service.binder is not None and service.binder.leader_protocol:  # where followers forward bind to
        verbs[FORWARDED_SUFFIX.strip("/")] = _answerer(
            "bind", ExtenderBindingArgs, service.bind_here, lambda: ExtenderBindingResult(error=INTERNAL)
        )
    return verbs


Reply = tuple[int, bytes, str]
"""What a route answers: status, body, and its Content-Type."""

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"


def _counted(
    verb: str, answer: Callable[[bytes], Awaitable[Answer]], service: ExtenderService
) -> Callable[[bytes], Awaitable[Reply]]:
    """`answer` with the request counted and timed in the extender's metrics."""
    metrics = service.metrics
    requests, latency = metrics.requests, metrics.latency.labels(verb)

    async def reply(raw: bytes) -> Reply:
        start = time.perf_counter()
        outcome = "error"
        try:
            status, body, outcome = await answer(raw)
        finally:
            requests.labels(verb, outcome).inc()
            latency.observe(time.perf_counter() - start)
        return status, body, JSON_TYPE if status == 200 else TEXT_TYPE

    return reply


def verb_replies(
    service: ExtenderService, prefix: str = DEFAULT_PREFIX
) -> dict[str, Callable[[bytes], Awaitable[Reply]]]:
    """Per route path (e.g. "/gpu-extender/filter"), its request-body-to-reply function, counted in the
    metrics: what both the aiohttp routes and the lean verb path (`fastpath.py`) serve."""
    base = "/" + prefix.strip("/") if prefix.strip("/") else ""
    # "bind/forwarded" counts as bind_forwarded
    return {
        f"{base}/{verb}": _counted(verb.replace("/", "_"), answer, service)
        for verb, answer in answerers(service).items()
    }


def _handler(
    verb: str, reply: Callable[[bytes], Awaitable[Reply]], service: ExtenderService
) -> Callable[[web.Request], Awaitable[web.Response]]:
    metrics = service.metrics
    requests, latency = metrics.requests, metrics.latency.labels(verb)

    async def handle(request: web.Request) -> web.Response:
        start = time.perf_counter()
        try:
            raw = await _read_body(request, service.max_body_bytes)
        except web.HTTPException:
            requests.labels(verb, "bad_request").inc()
            latency.observe(time.perf_counter() - start)
            raise
        status, body, _ = await reply(raw)
        if status != 200:
            return web.Response(status=status, body=body, content_type="text/plain", charset="utf-8")
        return web.Response(body=body, content_type="application/json")

    return handle


def extender_routes(service: ExtenderService, prefix: str = DEFAULT_PREFIX) -> web.RouteTableDef:
    """The four routes under `prefix` (e.g. "/gpu-extender" -> POST /gpu-extender/filter ...)."""
    routes = web.RouteTableDef()
    for path, reply in verb_replies(service, prefix).items():
        verb = "bind_forwarded" if path.endswith(FORWARDED_SUFFIX) else path.rsplit("/", 1)[-1]
        routes.post(path)(_handler(verb, reply, service))
    return routes


def add_extender_routes(app: web.Application, service: ExtenderService, prefix: str = DEFAULT_PREFIX) -> None:
    """Mount the extender on an existing aiohttp application (the controller's HTTP server)."""
    app.add_routes(extender_routes(service, prefix))
