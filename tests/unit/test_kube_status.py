"""Mapping of API answers and transport failures onto the KubeError hierarchy (gpuwarden.kube.status)."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from gpuwarden.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeGone,
    KubeNotFound,
    KubeUnreachable,
)
from gpuwarden.kube.status import (
    error_from_api_exception,
    error_from_status,
    error_from_status_object,
    error_from_transport,
    outcome_of,
    parse_status,
)


def status_body(code: int, reason: str, message: str, **details: object) -> str:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    body |= {"reason": reason, "message": message}
    if details:
        body["details"] = details
    return json.dumps(body)


@pytest.mark.parametrize(
    ("status", "body", "headers", "cls", "reason", "retryable", "retry_after"),
    [
        pytest.param(
            404,
            status_body(404, "NotFound", 'nodes "x" not found'),
            None,
            KubeNotFound,
            "NotFound",
            False,
            None,
            id="404-not-found",
        ),
        pytest.param(
            409,
            status_body(409, "Conflict", "the object has been modified"),
            None,
            KubeConflict,
            "Conflict",
            True,
            None,
            id="409-conflict",
        ),
        pytest.param(
            409,
            status_body(409, "AlreadyExists", "already exists"),
            None,
            KubeConflict,
            "AlreadyExists",
            True,
            None,
            id="409-already-exists",
        ),
        pytest.param(
            410,
            status_body(410, "Expired", "too old resource version"),
            None,
            KubeGone,
            "Expired",
            True,
            None,
            id="410-gone",
        ),
        pytest.param(
            401,
            status_body(401, "Unauthorized", "Unauthorized"),
            None,
            KubeForbidden,
            "Unauthorized",
            False,
            None,
            id="401-forbidden",
        ),
        pytest.param(
            403,
            status_body(403, "Forbidden", "cannot patch nodes"),
            None,
            KubeForbidden,
            "Forbidden",
            False,
            None,
            id="403-forbidden",
        ),
        pytest.param(
            429,
            status_body(429, "TooManyRequests", "slow down", retryAfterSeconds=3),
            None,
            KubeUnreachable,
            "TooManyRequests",
            True,
            3.0,
            id="429-retry-after-in-details",
        ),
        pytest.param(
            503,
            "",
            {"Retry-After": "7"},
            KubeUnreachable,
            "Service Unavailable",
            True,
            7.0,
            id="503-retry-after-header-no-body",
        ),
        pytest.param(
            500,
            "<html>oops</html>",
            None,
            KubeUnreachable,
            "Internal Server Error",
            True,
            None,
            id="500-non-json-body",
        ),
        pytest.param(
            422,
            status_body(422, "Invalid", "spec.taints: Invalid value"),
            None,
            KubeError,
            "Invalid",
            False,
            None,
            id="422-invalid-plain-kube-error",
        ),
        pytest.param(
            400,
            status_body(400, "BadRequest", "bad patch"),
            None,
            KubeError,
            "BadRequest",
            False,
            None,
            id="400-bad-request",
        ),
        pytest.param(
            503,
            "",
            {"retry-after": "soon"},
            KubeUnreachable,
            "Service Unavailable",
            True,
            None,
            id="503-unparsable-retry-after",
        ),
    ],
)
def test_error_from_status(
    status: int,
    body: str,
    headers: dict[str, str] | None,
    cls: type[KubeError],
    reason: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    http_reason = {500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "")
    err = error_from_status(status, body, headers, http_reason=http_reason)
    assert type(err) is cls
    assert err.status == status
    assert err.reason == reason
    assert err.retryable is retryable
    assert err.retry_after == retry_after
    assert str(status) in err.message


def test_status_message_is_the_servers_message() -> None:
    err = error_from_status(404, status_body(404, "NotFound", 'nodes "gpu-7" not found'))
    assert err.message == '404 nodes "gpu-7" not found'


def test_watch_error_event_status_object_maps_like_http() -> None:
    obj = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1 (42)"}
    err = error_from_status_object(410, obj)
    assert isinstance(err, KubeGone)
    assert "too old resource version" in err.message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(None, {}, id="none"),
        pytest.param(b"", {}, id="empty"),
        pytest.param(b"not json", {}, id="garbage"),
        pytest.param(b"[1, 2]", {}, id="json-but-not-object"),
        pytest.param(b'{"reason": "NotFound"}', {"reason": "NotFound"}, id="object"),
        pytest.param(b"\xff\xfe", {}, id="not-utf8"),
    ],
)
def test_parse_status(body: bytes | None, expected: dict[str, object]) -> None:
    assert parse_status(body) == expected


def test_api_exception_with_http_status_is_mapped() -> None:
    exc = ApiException(status=409, reason="Conflict")
    exc.body = status_body(409, "Conflict", "the object has been modified")
    err = error_from_api_exception(exc)
    assert isinstance(err, KubeConflict)
    assert err.reason == "Conflict"


def test_api_exception_status_zero_is_unreachable() -> None:
    err = error_from_api_exception(ApiException(status=0, reason="SSLError\ncertificate verify failed"))
    assert isinstance(err, KubeUnreachable)
    assert "certificate verify failed" in err.message


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(
            urllib3.exceptions.MaxRetryError(None, "/api", reason=ConnectionRefusedError(111, "refused")),
            id="max-retry-connection-refused",
        ),
        pytest.param(urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"), id="read-timeout"),
        pytest.param(urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead"), id="truncated"),
        pytest.param(ConnectionResetError(104, "reset by peer"), id="os-error"),
    ],
)
def test_transport_errors_are_unreachable(exc: BaseException) -> None:
    err = error_from_transport(exc)
    assert isinstance(err, KubeUnreachable)
    assert err.retryable
    assert type(exc).__name__ in err.message


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        pytest.param(None, "success", id="success"),
        pytest.param(KubeNotFound("x"), "not_found", id="not-found"),
        pytest.param(KubeConflict("x"), "conflict", id="conflict"),
        pytest.param(KubeGone("x"), "gone", id="gone"),
        pytest.param(KubeForbidden("x"), "forbidden", id="forbidden"),
        pytest.param(KubeUnreachable("x"), "unreachable", id="unreachable"),
        pytest.param(KubeError("x", status=422), "error", id="other"),
    ],
)
def test_outcome_label(error: BaseException | None, outcome: str) -> None:
    assert outcome_of(error) == outcome
