"""What can go wrong while answering a metrics request, as policy — the HTTP shape is chosen at the edge.

Why: the provider and the router must say *what* happened (unknown metric, bad input, backend down) without
knowing about `metav1.Status`; `adapter.server` maps each class to a code and reason exactly once. Any other
exception is a bug or an unexpected backend answer and becomes a generic 500 whose detail is only logged.
"""

from __future__ import annotations


class ApiError(Exception):
    """Base: `message` is safe to show to API callers."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ApiError):
    """Unknown route, metric, or object without a value (404 NotFound); `details` names the object."""

    def __init__(self, message: str, *, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.details = details


class BadRequest(ApiError):
    """Malformed path, name or selector; the message names the problem (400 BadRequest)."""


class Unavailable(ApiError):
    """The backend (Prometheus, the object cache) cannot answer now; the HPA keeps its scale (503)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unauthorized(ApiError):
    """No acceptable credentials (401)."""


class Forbidden(ApiError):
    """Authenticated, but not allowed (403)."""


class Internal(ApiError):
    """Generic failure; `detail` goes to the logs, callers see only `message` (500)."""

    def __init__(self, detail: str, message: str = "unable to fetch metrics") -> None:
        super().__init__(message)
        self.detail = detail
