"""The `prometheus:` section — how to reach Prometheus (or Thanos Query, Mimir, VictoriaMetrics).

Consumed only by `gpuwarden.promclient`, the single choke point for Prometheus traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, HttpUrl, model_validator

from gpuwarden.config.base import Section


class BasicAuth(Section):
    """HTTP basic auth; the password is read from a file so it never sits in the config."""

    username: str = Field(description="Basic-auth user name.")
    password_file: Path = Field(description="File holding the password (re-read on every request batch).")


class TLS(Section):
    """TLS to Prometheus: a private CA, a client certificate (mTLS), or (for tests only) no verification."""

    ca_file: Path | None = Field(default=None, description="PEM CA bundle to verify the server with.")
    cert_file: Path | None = Field(default=None, description="PEM client certificate for mTLS.")
    key_file: Path | None = Field(default=None, description="PEM private key of `cert_file`.")
    insecure_skip_verify: bool = Field(
        default=False, description="Do not verify the server certificate. Never in production."
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        return self


class PrometheusConfig(Section):
    """Where Prometheus is and how to talk to it."""

    url: HttpUrl = Field(
        default=HttpUrl("http://127.0.0.1:9090"),
        description="Base URL of the Prometheus HTTP API (without /api/v1). For Mimir include the "
        "prefix, e.g. http://mimir/prometheus. Default: a local Prometheus, as in the demo.",
    )
    method: Literal["GET", "POST"] = Field(
        default="POST",
        description="HTTP method for queries. POST (form-encoded) avoids URL-length limits with long "
        "label matchers; every Prometheus-compatible server accepts it.",
    )
    timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Per-query timeout in seconds, sent as Prometheus' `timeout` parameter and enforced "
        "client-side. 10 s keeps an HPA sync (15 s default) from stalling on one slow query.",
    )
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries for read requests after a retryable failure (unreachable, timeout, 5xx, 429). "
        "Bad queries are never retried.",
    )
    retry_backoff_seconds: float = Field(
        default=0.2,
        ge=0,
        description="First back-off in seconds; doubled each retry, with jitter, capped at 5 s. "
        "A server-sent Retry-After wins when larger.",
    )
    bearer_token_file: Path | None = Field(
        default=None,
        description="File holding a bearer token; re-read when it changes (projected service-account "
        "tokens rotate).",
    )
    basic_auth: BasicAuth | None = Field(default=None, description="HTTP basic auth.")
    tls: TLS = Field(default_factory=TLS, description="TLS settings.")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Static headers on every request, e.g. {'X-Scope-OrgID': 'tenant-a'} for Mimir/Cortex.",
    )
    extra_query_params: dict[str, str] = Field(
        default_factory=dict,
        description="Extra query parameters on every query, e.g. {'dedup': 'true'} for Thanos or "
        "{'nocache': '1'} for VictoriaMetrics.",
    )

    @model_validator(mode="after")
    def _one_auth(self) -> PrometheusConfig:
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise ValueError("bearer_token_file and basic_auth are mutually exclusive")
        return self
