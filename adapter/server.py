"""The aiohttp application: discovery, metric values, probes, /metrics and OpenAPI, with errors as Status.

Why: this is the edge. It turns HTTP into `adapter.routing` routes, asks `adapter.provider` for values, and
maps every failure to a `metav1.Status` with the right code and reason exactly once (`_status_for`): 404
unknown metric/object/route, 400 malformed input (message names the problem), 503 backend unavailable,
401/403 from authentication/authorization, 500 for anything else with the detail only in the log.

Discovery (`/apis`, `/apis/<group>`, `/apis/<group>/<version>`) never fails: before the first discovery the
resource lists are simply empty. Probes are answered without authentication; `/readyz` turns 200 once requests
can be answered: after the first successful series discovery and, with Kubernetes access, once the pod and
node label caches have completed their first list (before that, selector requests would answer 503).
Nothing here blocks on Prometheus except value requests.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter import auth, resource_wire, wire
from adapter.errors import ApiError, BadRequest, Forbidden, Internal, NotFound, Unauthorized, Unavailable
from adapter.provider import Provider
from adapter.registry import Registry
from adapter.resource_provider import ResourceProvider
from adapter.routing import CustomRoute, DiscoveryRoute, ExternalRoute, ResourceRoute, Route, route
from adapter.selfmetrics import AdapterMetrics
from gpuwarden import __version__
from gpuwarden.errors import KubeError
from gpuwarden.selfmetrics import metrics_handler

log = logging.getLogger(__name__)

JSON = "application/json"
PROBES = ("/healthz", "/livez", "/readyz")
_GROUPS = [(wire.CUSTOM_GROUP, wire.CUSTOM_VERSIONS), (wire.EXTERNAL_GROUP, wire.EXTERNAL_VERSIONS)]
_RESOURCE_GROUP = (resource_wire.METRICS_GROUP, resource_wire.METRICS_VERSIONS)


def served_groups(resource_metrics: bool) -> list[tuple[str, tuple[str, ...]]]:
    """The API groups this adapter serves; metrics.k8s.io only with `resourceRules`."""
    return [*_GROUPS, _RESOURCE_GROUP] if resource_metrics else list(_GROUPS)


@dataclass(frozen=True)
class Security:
    """Authentication and authorization hooks; None in `AdapterState.security` means "allow everyone"."""

    authenticator: auth.Authenticator
    authorize: Callable[[auth.UserInfo, Mapping[str, Any]], Awaitable[bool]]
    always_allow: frozenset[str] = frozenset(PROBES)


@dataclass(frozen=True)
class AdapterState:
    """What the handlers need, injected so tests can build an app around fakes or a real Prometheus."""

    provider: Provider
    registry: Callable[[], Registry]
    not_ready: Callable[[], str | None]
    """None once requests can be answered, else why not (the body of /readyz's 503)."""
    metrics: AdapterMetrics
    collector_registry: CollectorRegistry
    security: Security | None = None
    resource: ResourceProvider | None = None
    """metrics.k8s.io, when `resourceRules` are configured."""


def _json(doc: Mapping[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(doc, separators=(",", ":")).encode(), status=status, content_type=JSON
    )


def _status_for(exc: BaseException) -> wire.Status:
    if isinstance(exc, NotFound):
        if exc.details:
            return wire.not_found_status(exc.message, cast(wire.StatusDetails, dict(exc.details)))
        return wire.status(404, "NotFound", exc.message)
    if isinstance(exc, BadRequest):
        return wire.status(400, "BadRequest", exc.message)
    if isinstance(exc, Unavailable):
        retry = int(exc.retry_after) if exc.retry_after else None
        return wire.status(503, "ServiceUnavailable", exc.message, retry_after=retry)
    if isinstance(exc, Unauthorized):
        return wire.status(401, "Unauthorized", exc.message)
    if isinstance(exc, Forbidden):
        return wire.status(403, "Forbidden", exc.message)
    message = exc.message if isinstance(exc, Internal) else "unable to fetch metrics"
    return wire.status(500, "InternalError", f"Internal error occurred: {message}")


def discovery_document(
    target: DiscoveryRoute, registry: Registry, *, resource_metrics: bool = False
) -> Mapping[str, Any]:
    """Pure: the discovery answer for `/apis[/<group>[/<version>]]`."""
    groups = served_groups(resource_metrics)
    if not target.group:
        return wire.api_group_list(groups)
    if target.group not in dict(groups):
        raise NotFound("the server could not find the requested resource")
    if not target.version:
        versions = dict(groups)[target.group]
        return wire.api_group(target.group, versions, top_level=True)
    if target.group == resource_wire.METRICS_GROUP:
        return resource_wire.api_resource_list()
    gv = f"{target.group}/{target.version}"
    if target.group == wire.CUSTOM_GROUP:
        return wire.api_resource_list(gv, registry.custom_resources())
    return wire.api_resource_list(gv, registry.external_resources())


def openapi_v2() -> dict[str, Any]:
    return {"swagger": "2.0", "info": {"title": "gpuwarden-adapter", "version": __version__}, "paths": {}}


def openapi_v3_index(resource_metrics: bool = False) -> dict[str, Any]:
    paths = {
        f"apis/{g}/{v}": {"serverRelativeURL": f"/openapi/v3/apis/{g}/{v}"}
        for g, vs in served_groups(resource_metrics)
        for v in vs
    }
    return {"paths": paths}


def openapi_v3(group_version: str) -> dict[str, Any]:
    return {"openapi": "3.0.0", "info": {"title": group_version, "version": __version__}, "paths": {}}


def _template(request: web.Request, target: Route | None) -> str:
    path = request.path
    if path in PROBES or path == "/metrics":
        return path.strip("/")
    if path.startswith("/openapi/"):
        return "openapi"
    if isinstance(target, DiscoveryRoute):
        return "discovery"
    if isinstance(target, CustomRoute | ExternalRoute | ResourceRoute):
        return target.template
    return "other"


def _headers(request: web.Request) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in request.headers.items():
        out.setdefault(key.lower(), []).append(value)
    return out


async def _check_access(security: Security, request: web.Request, target: Route | None) -> None:
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    cert = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    try:
        user = await security.authenticator.authenticate(cert, _headers(request))
        if user is None:
            raise Unauthorized("Unauthorized")
        attributes = auth.review_attributes(request.method, request.raw_path, target)
        if auth.allowed_without_review(user, attributes) or await security.authorize(user, attributes):
            return
    except KubeError as exc:
        log.warning("authorization check failed", extra={"error": str(exc)})
        raise Unavailable("authorization check unavailable", retry_after=1) from exc
    raise Forbidden(f'user "{user.name}" cannot {request.method.lower()} path "{request.path}"')


def build_app(state: AdapterState) -> web.Application:
    """The application; mount it on TLS (and optionally a loopback plain-HTTP) site."""
    render_metrics = metrics_handler(state.collector_registry)

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        target: Route | None = None
        response: web.StreamResponse
        try:
            if request.path.startswith("/apis"):
                try:
                    target = route(request.raw_path, {k: request.query[k] for k in request.query})
                except ApiError as exc:
                    route_error: ApiError | None = exc
                else:
                    route_error = None
            else:
                route_error = None
            if state.security is not None and request.path not in state.security.always_allow:
                await _check_access(state.security, request, target)
            if request.method not in ("GET", "HEAD"):
                response = _json(
                    wire.status(405, "MethodNotAllowed", f"{request.method} is not supported"), 405
                )
            elif route_error is not None:
                raise route_error
            else:
                response = await _dispatch(state, request, target, render_metrics)
        except Exception as exc:
            doc = _status_for(exc)
            if doc["code"] == 500:
                detail = exc.detail if isinstance(exc, Internal) else repr(exc)
                log.error(
                    "request failed",
                    extra={"path": request.path, "detail": detail},
                    exc_info=not isinstance(exc, ApiError),
                )
            response = _json(doc, doc["code"])
            if doc.get("details", {}).get("retryAfterSeconds"):
                response.headers["Retry-After"] = str(doc["details"]["retryAfterSeconds"])
        route_name = _template(request, target)
        state.metrics.requests.labels(route_name, str(response.status)).inc()
        state.metrics.request_duration.labels(route_name).observe(time.perf_counter() - started)
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _dispatch(
    state: AdapterState,
    request: web.Request,
    target: Route | None,
    render_metrics: Callable[[web.Request], object],
) -> web.StreamResponse:
    path = request.path
    if path in ("/healthz", "/livez"):
        return web.Response(text="ok")
    if path == "/readyz":
        reason = state.not_ready()
        if reason is None:
            return web.Response(text="ok")
        return web.Response(text=f"not ready: {reason}", status=503)
    if path == "/metrics":
        result = render_metrics(request)
        assert isinstance(result, Awaitable)
        response: web.StreamResponse = await result
        return response
    if path == "/openapi/v2":
        return _json(openapi_v2())
    resource_metrics = state.resource is not None
    if path == "/openapi/v3":
        return _json(openapi_v3_index(resource_metrics))
    if path.startswith("/openapi/v3/apis/"):
        gv = path.removeprefix("/openapi/v3/apis/")
        if gv in {f"{g}/{v}" for g, vs in served_groups(resource_metrics) for v in vs}:
            return _json(openapi_v3(gv))
    if isinstance(target, DiscoveryRoute):
        return _json(discovery_document(target, state.registry(), resource_metrics=resource_metrics))
    if isinstance(target, ResourceRoute):
        if state.resource is None:
            raise NotFound("the server could not find the requested resource")
        if target.kind == "nodes":
            return _json(await state.resource.nodes(target))
        return _json(await state.resource.pods(target))
    if isinstance(target, CustomRoute):
        return _json(await state.provider.custom(target))
    if isinstance(target, ExternalRoute):
        return _json(await state.provider.external(target))
    raise NotFound("the server could not find the requested resource")
