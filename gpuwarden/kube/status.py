"""Mapping of API-server answers and transport failures onto gpuwarden's `KubeError` hierarchy.

Why it exists: the `kubernetes` client raises `ApiException` (with the `Status` JSON as a string body) and
lets urllib3 errors escape; callers must never see either (third-party exceptions stop at the one Kubernetes
access module, `gpuwarden.kube`). Every failure is turned into one of `KubeUnreachable`, `KubeNotFound`,
`KubeConflict`, `KubeGone`, `KubeForbidden` or a plain `KubeError`, carrying the HTTP status, the
`Status.reason` and, when the server sent one, `retry_after`.

Policy encoded here: 429 and 5xx mean "the API server could not serve us now" and map to the retryable
`KubeUnreachable` (as client-go retries them); other 4xx are caller bugs and are not retryable.

This module is pure (no I/O, no logging) so the mapping is table-tested; it must not import the client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuwarden.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeGone,
    KubeNotFound,
    KubeUnreachable,
)
from gpuwarden.kube.protobuf import is_protobuf, status_body

_BY_STATUS: dict[int, type[KubeError]] = {
    401: KubeForbidden,
    403: KubeForbidden,
    404: KubeNotFound,
    409: KubeConflict,
    410: KubeGone,
}

OUTCOMES: dict[type[BaseException], str] = {
    KubeUnreachable: "unreachable",
    KubeNotFound: "not_found",
    KubeConflict: "conflict",
    KubeGone: "gone",
    KubeForbidden: "forbidden",
}


def outcome_of(error: BaseException | None) -> str:
    """The `outcome` label value for a request that ended with `error` (None: success)."""
    if error is None:
        return "success"
    return OUTCOMES.get(type(error), "error")


def _retry_after(headers: Mapping[str, str] | None, status_obj: Mapping[str, Any]) -> float | None:
    if headers:
        for key, value in headers.items():
            if key.lower() == "retry-after":
                try:
                    return max(0.0, float(value))
                except ValueError:
                    return None
    details = status_obj.get("details")
    if isinstance(details, Mapping):
        seconds = details.get("retryAfterSeconds")
        if isinstance(seconds, int | float) and seconds > 0:
            return float(seconds)
    return None


def parse_status(body: bytes | str | None) -> dict[str, Any]:
    """The `Status` object in an error body (JSON, or protobuf when protobuf was asked for), or {} when the
    body is empty or not a Status."""
    if not body:
        return {}
    if isinstance(body, bytes) and is_protobuf(body):
        return status_body(body)
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def error_from_status(
    status: int,
    body: bytes | str | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    http_reason: str = "",
) -> KubeError:
    """The `KubeError` for an HTTP error answer (or a watch ERROR event's `Status`, with `status=code`)."""
    status_obj = parse_status(body)
    return error_from_status_object(status, status_obj, headers, http_reason=http_reason)


def error_from_status_object(
    status: int,
    status_obj: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    *,
    http_reason: str = "",
) -> KubeError:
    """Like `error_from_status` for an already-parsed `Status` object."""
    reason = str(status_obj.get("reason") or http_reason or "")
    message = str(status_obj.get("message") or reason or f"HTTP {status}")
    retry_after = _retry_after(headers, status_obj)
    server_side = status == 429 or 500 <= status <= 599
    cls = KubeUnreachable if server_side else _BY_STATUS.get(status, KubeError)
    return cls(f"{status} {message}", status=status, reason=reason, retry_after=retry_after)


def error_from_api_exception(exc: Any) -> KubeError:
    """Map a `kubernetes.client.ApiException` (duck-typed: status, reason, body, headers)."""
    status = getattr(exc, "status", None) or 0
    if status == 0:
        # The client raises status 0 for TLS failures and requests it could not build.
        return KubeUnreachable(f"API server unreachable: {getattr(exc, 'reason', exc)}", reason="Unreachable")
    headers = getattr(exc, "headers", None)
    return error_from_status(
        int(status),
        getattr(exc, "body", None),
        dict(headers) if headers else None,
        http_reason=str(getattr(exc, "reason", "") or ""),
    )


def error_from_transport(exc: BaseException) -> KubeUnreachable:
    """Connection refused, DNS, TLS, read timeout, truncated chunked body: the server was not reachable."""
    detail = str(exc).strip() or type(exc).__name__
    return KubeUnreachable(f"API server unreachable: {type(exc).__name__}: {detail}", reason="Unreachable")
