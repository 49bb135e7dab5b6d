"""Our small error hierarchy.

Third-party exceptions (httpx, kubernetes, aiohttp) must not leak past the choke-point modules that talk to
external systems; they are mapped to these. Each error carries policy — whether a retry may help and after
how long — so callers decide without inspecting messages. HTTP/Kubernetes shapes are chosen only at the edge.
"""

from __future__ import annotations


class GpuwardenError(Exception):
    """Base of every error gpuwarden raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class ConfigError(GpuwardenError):
    """The configuration is invalid; `problems` lists every (field, message) pair at once."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{field}: {msg}" for field, msg in problems))


class PrometheusError(GpuwardenError):
    """Base for every failure talking to Prometheus (or Thanos / Mimir / VictoriaMetrics)."""


class PrometheusUnreachable(PrometheusError):
    """Connection refused, DNS failure, TLS failure: the server could not be reached."""

    retryable = True


class PrometheusTimeout(PrometheusError):
    """The query did not finish within its timeout (client-side or Prometheus' own)."""

    retryable = True


class PrometheusBadQuery(PrometheusError):
    """Prometheus rejected the query (HTTP 400/422); the message is Prometheus' own. Never retried."""

    def __init__(self, message: str, *, error_type: str = "bad_data") -> None:
        super().__init__(message)
        self.error_type = error_type


class PrometheusServerError(PrometheusError):
    """5xx, 429, or a response that is not a valid Prometheus API answer (e.g. truncated JSON)."""

    retryable = True

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.status = status


class KubeError(GpuwardenError):
    """Base for every failure talking to the Kubernetes API."""

    def __init__(
        self, message: str, *, status: int | None = None, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.status = status
        self.reason = reason


class KubeUnreachable(KubeError):
    """The API server could not be reached."""

    retryable = True


class KubeNotFound(KubeError):
    """404: the object does not exist."""


class KubeConflict(KubeError):
    """409: resourceVersion conflict or already exists; re-read and retry."""

    retryable = True


class KubeGone(KubeError):
    """410 Gone: the watch resourceVersion is too old; relist."""

    retryable = True


class KubeForbidden(KubeError):
    """401/403: our RBAC does not allow this. Not retried."""
