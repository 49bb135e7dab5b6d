"""The `adapter:` section — the custom/external metrics API server the HPA controller reads.

Why a section of its own: the adapter is a separate deployable (stateless, 2+ replicas) with its own listener,
certificates, authentication and Prometheus load budget. Its metric definitions are prometheus-adapter's
`rules` / `externalRules` (see `metric_rules`, pasted here unchanged or read from `rules_file`) plus built-in
presets for GPU fleets, so the common case needs no PromQL at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import (
    FieldError,
    LabelName,
    MetricName,
    NoBool,
    Port,
    PositiveCount,
    Seconds,
)
from gpuwarden.config.metric_rules import PrometheusAdapterRules


class GpuUtilizationPreset(Section):
    """`gpu_utilization`: percent busy per pod, averaged over the pod's GPUs (0-100)."""

    enabled: bool = Field(default=True, description="Serve this metric.")
    name: MetricName = Field(default="gpu_utilization", description="Metric name HPAs ask for.")
    source: Literal["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"] = Field(
        default="DCGM_FI_DEV_GPU_UTIL",
        description="DCGM field to read. DCGM_FI_DEV_GPU_UTIL (percent of time a kernel ran) is exported "
        "by default everywhere; DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio, scaled to percent) is more accurate "
        "but needs DCGM's profiling module. MIG instances have no DCGM_FI_DEV_GPU_UTIL: their "
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE is read either way (docs/presets.md, Shared GPUs).",
    )


class GpuMemoryPreset(Section):
    """`gpu_memory_used_ratio`: framebuffer used / (used + free) per pod, 0-1 (DCGM_FI_DEV_FB_USED, _FREE)."""

    enabled: bool = Field(default=True, description="Serve this metric.")
    name: MetricName = Field(default="gpu_memory_used_ratio", description="Metric name HPAs ask for.")


class RequestsPerSecondPreset(Section):
    """`requests_per_second`: rate of an application request counter per pod."""

    enabled: bool = Field(default=True, description="Serve this metric.")
    name: MetricName = Field(default="requests_per_second", description="Metric name HPAs ask for.")
    series: MetricName = Field(
        default="http_requests_total",
        description="Counter to take the rate of. http_requests_total is the Prometheus naming convention.",
    )
    rate_window_seconds: Seconds = Field(
        default=120.0,
        ge=10,
        description="Range of the rate() in seconds. 2 min spans at least four samples at a 30 s scrape "
        "interval, so one missed scrape does not blank the value.",
    )
    pod_label: LabelName = Field(default="pod", description="Label holding the pod name on the series.")
    namespace_label: LabelName = Field(default="namespace", description="Label holding the namespace.")


ServingEngine = Literal["vllm", "tgi", "sglang", "triton"]
"""The serving engines the engine presets know (`adapter.engines.ENGINES`; a unit test holds them equal)."""


def _all_engines() -> list[ServingEngine]:
    return ["vllm", "tgi", "sglang", "triton"]


class EnginePresets(Section):
    """Serving-engine metrics per pod: queue depth, running requests, KV-cache use, TTFT p90, tokens/s
    (`<engine>_<quantity>`; docs/presets.md, Serving engines)."""

    enabled: bool = Field(default=True, description="Serve the engines' metrics.")
    engines: list[ServingEngine] = Field(
        default_factory=_all_engines,
        description="Engines whose metrics are served. A metric is listed only once its series exist, so "
        "engines you do not run cost one discovery match each, nothing more.",
    )
    rate_window_seconds: Seconds = Field(
        default=120.0,
        ge=10,
        description="Range of the rate() behind TTFT p90 and tokens/s, in seconds. 2 min spans at least "
        "four samples at a 30 s scrape interval, so one missed scrape does not blank the value.",
    )
    pod_label: LabelName = Field(default="pod", description="Label holding the pod name on the series.")
    namespace_label: LabelName = Field(default="namespace", description="Label holding the namespace.")


class RouterQueuePreset(Section):
    """`router_queue_depth`: an external metric, requests waiting at a gateway or router in front of a
    workload. It exists while no pod runs, so it can wake a Deployment parked at zero (HPA `minReplicas: 0`,
    KEDA `preset: router-queue`)."""

    enabled: bool = Field(default=True, description="Serve this metric.")
    name: MetricName = Field(default="router_queue_depth", description="Metric name HPAs ask for.")
    series: MetricName = Field(
        default="router_queue_depth",
        description="Gauge of requests waiting for a backend, labelled by the workload it routes to. No "
        "engine-neutral name exists upstream: point this at your router's gauge, or record it under "
        "this name.",
    )
    namespace_label: LabelName = Field(default="namespace", description="Label holding the namespace.")


class Presets(Section):
    """Built-in metrics for GPU fleets, added to whatever `rules` define."""

    dcgm_pod_label: LabelName = Field(
        default="pod",
        description="Label holding the pod name on dcgm-exporter series. Use `exported_pod` when "
        "Prometheus scrapes dcgm-exporter with honor_labels: false (the Helm charts' default).",
    )
    dcgm_namespace_label: LabelName = Field(
        default="namespace",
        description="Label holding the namespace on dcgm-exporter series; `exported_namespace` likewise.",
    )
    gpu_utilization: GpuUtilizationPreset = Field(
        default_factory=GpuUtilizationPreset, description="GPU utilization per pod."
    )
    gpu_memory_used_ratio: GpuMemoryPreset = Field(
        default_factory=GpuMemoryPreset, description="GPU memory used ratio per pod."
    )
    requests_per_second: RequestsPerSecondPreset = Field(
        default_factory=RequestsPerSecondPreset, description="Requests per second per pod."
    )
    engines: EnginePresets = Field(
        default_factory=EnginePresets,
        description="Serving-engine metrics per pod (vLLM, TGI, SGLang, Triton).",
    )
    router_queue: RouterQueuePreset = Field(
        default_factory=RouterQueuePreset,
        description="A router's queue, external: wakes a workload from zero.",
    )

    @model_validator(mode="after")
    def _names_unique(self) -> Presets:
        seen: dict[str, str] = {}
        for key in ("gpu_utilization", "gpu_memory_used_ratio", "requests_per_second", "router_queue"):
            preset = getattr(self, key)
            if preset.enabled and preset.name in seen:
                raise FieldError(
                    f"{key}.name", f"{preset.name!r} is already served by preset {seen[preset.name]}"
                )
            seen[preset.name] = key
        if self.engines.enabled:
            for engine in self.engines.engines:
                for metric, key in seen.items():
                    if metric.startswith(f"{engine}_"):
                        raise FieldError(
                            f"{key}.name",
                            f"{metric!r} is named like an engine preset (adapter.presets.engines)",
                        )
        return self


class ServingTLS(Section):
    """The adapter's serving certificate. Without one, a self-signed certificate is generated at start."""

    cert_file: Path | None = Field(
        default=None,
        description="PEM serving certificate. null: generate a self-signed one at start (fine behind an "
        "APIService with insecureSkipTLSVerify; give a real one with caBundle in production).",
    )
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file.")
    min_version: Literal["TLSv1.2", "TLSv1.3"] = Field(
        default="TLSv1.2",
        description="Lowest TLS version accepted. TLSv1.2 because kube-apiserver's aggregator speaks it.",
    )
    reload_interval_seconds: Seconds = Field(
        default=10.0,
        ge=1,
        le=3600,
        description="Seconds between checks of cert_file/key_file for a rotated pair (cert-manager, "
        "kubelet), and of the trusted client CAs (their files, or the authentication ConfigMap: one GET "
        "per check). A changed, valid pair serves new handshakes "
        "without a restart (connections already open keep the pair they started with); an invalid or "
        "mismatched one is logged and counted and the previous pair keeps serving.",
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> ServingTLS:
        if (self.cert_file is None) != (self.key_file is None):
            missing = "key_file" if self.key_file is None else "cert_file"
            raise FieldError(missing, "cert_file and key_file must be set together (or both left null)")
        return self


class Authentication(Section):
    """Who may call the adapter: the aggregator (front-proxy client certificate) and bearer tokens."""

    enabled: bool = Field(
        default=True,
        description="Authenticate and authorize every request except always_allow_paths. Turning it off "
        "lets anyone who reaches the port read every metric; only for local experiments.",
    )
    requestheader_client_ca_file: Path | None = Field(
        default=None,
        description="CA that signs the aggregator's front-proxy client certificate. null: read "
        "requestheader-client-ca-file from ConfigMap kube-system/extension-apiserver-authentication. "
        "A file is re-read every tls.reload_interval_seconds: changed, valid PEM certificates are "
        "trusted by new handshakes and requests without a restart (an invalid file is logged and "
        "counted, and the previous CAs stay trusted). The ConfigMap is re-read on the same interval and "
        "judged the same way; a failed read or a missing key keeps the previous CAs.",
    )
    requestheader_allowed_names: list[str] | None = Field(
        default=None,
        description="Common names allowed to assert a user via headers. null: from the same ConfigMap "
        "(usually ['front-proxy-client']); an empty list allows any name signed by the CA. A certificate "
        "whose subject has other than one CN matches no name.",
    )
    client_ca_file: Path | None = Field(
        default=None,
        description="CA for ordinary client certificates (CN = the user, O = the groups; a subject with "
        "no CN or several names nobody: Kubernetes takes the last CN and other readers the first, so such "
        "a certificate is refused rather than read one way). null: client-ca-file from the same ConfigMap. "
        "Reloaded from the file or the ConfigMap like requestheader_client_ca_file.",
    )
    token_review: bool = Field(
        default=True,
        description="Accept bearer tokens, checked with a TokenReview (e.g. Prometheus scraping /metrics "
        "with its service-account token).",
    )
    cache_ttl_seconds: Seconds = Field(
        default=10.0,
        description="Seconds a TokenReview / SubjectAccessReview answer is cached. 10 s is "
        "k8s.io/apiserver's delegating default: one review per caller per HPA sync at most.",
    )
    refresh_ahead_seconds: Annotated[float, NoBool] = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="An *allowed* SubjectAccessReview answer past cache_ttl_seconds by at most this much is "
        "still used while one review re-asks in the background (its answer replaces it), so an HPA syncing "
        "every 15 s never waits for a review round trip. A revoked grant is then honoured for at most "
        "cache_ttl_seconds + this; denies are never used past their TTL. 0: every expired answer is "
        "re-asked in the request.",
    )
    always_allow_paths: list[str] = Field(
        default_factory=lambda: ["/healthz", "/livez", "/readyz"],
        description="Paths served without authentication (kubelet probes cannot present credentials).",
    )


class MetricCache(Section):
    """The demand-driven cache that makes Prometheus load independent of the number of HPAs."""

    mode: Literal["cache", "per_request"] = Field(
        default="cache",
        description="`cache`: refresh each (metric, namespace) HPAs ask for with one grouped query per "
        "refresh interval and answer from memory. `per_request`: query Prometheus on every API call, "
        "as prometheus-adapter does.",
    )
    refresh_interval_seconds: Seconds = Field(
        default=15.0,
        description="Seconds between refreshes of a cached (metric, namespace). 15 s is the HPA "
        "controller's default sync period: fresher data would not be read, staler would lag a sync.",
    )
    max_age_seconds: Seconds = Field(
        default=60.0,
        description="A cached answer older than this is not served (the API returns 503 and the HPA "
        "keeps its current scale). 60 s rides out three failed refreshes.",
    )
    idle_expiry_seconds: Seconds = Field(
        default=600.0,
        description="Stop refreshing a (metric, namespace) nobody asked for in this many seconds. 10 min "
        "covers a kube-controller-manager restart without dropping warm entries.",
    )

    @model_validator(mode="after")
    def _age_exceeds_refresh(self) -> MetricCache:
        if self.max_age_seconds <= self.refresh_interval_seconds:
            raise FieldError(
                "max_age_seconds",
                f"must be greater than refresh_interval_seconds ({self.refresh_interval_seconds:g}), or "
                "every answer expires before it is refreshed; e.g. 4 x the refresh interval",
            )
        return self


class KedaTLS(Section):
    """Transport security of the KEDA external scaler's gRPC port, as KEDA's `external` trigger speaks it.

    KEDA connects with TLS when the trigger sets `enableTLS: "true"` or its TriggerAuthentication gives
    `caCert` / `tlsClientCert` + `tlsClientKey` (PEM), and in plaintext otherwise.
    """

    plaintext: bool = Field(
        default=False,
        description="Serve the gRPC port without TLS (KEDA triggers then set no enableTLS/caCert). Off by "
        "default: metric values and selectors would cross the network in the clear; only for a trusted "
        "network or a local test.",
    )
    cert_file: Path | None = Field(
        default=None,
        description="PEM serving certificate of the gRPC port. null: the adapter's own serving pair "
        '(adapter.tls), which is self-signed when that is null too (KEDA then needs `unsafeSsl: "true"`, '
        "or give it a certificate its caCert can verify). The files (and client_ca_file) are re-read "
        "before a new connection's handshake when their size or mtime changed (rotation without a "
        "restart); an unusable set is logged and counted, and the previous one keeps serving.",
    )
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file.")
    client_ca_file: Path | None = Field(
        default=None,
        description="PEM CA bundle for mutual TLS: every client must present a certificate it signed "
        "(KEDA's TriggerAuthentication tlsClientCert/tlsClientKey). null: no client certificate asked for.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> KedaTLS:
        if (self.cert_file is None) != (self.key_file is None):
            missing = "key_file" if self.key_file is None else "cert_file"
            raise FieldError(missing, "cert_file and key_file must be set together (or both left null)")
        if self.plaintext and (self.cert_file is not None or self.client_ca_file is not None):
            field = "client_ca_file" if self.client_ca_file is not None else "cert_file"
            raise FieldError(field, "has no effect with plaintext: true; drop one of them")
        return self


class KedaScaler(Section):
    """KEDA's external scaler (gRPC `externalscaler.ExternalScaler`), answered from the same grouped cache.

    For clusters where KEDA owns external.metrics.k8s.io: ScaledObjects use an `external` (or
    `external-push`) trigger pointing here instead of one Prometheus query per trigger (docs/keda.md).
    """

    enabled: bool = Field(
        default=False,
        description="Serve the external scaler. Off by default: only clusters running KEDA need the port.",
    )
    bind_address: str = Field(
        default="0.0.0.0",
        description="Address the gRPC listener binds; 0.0.0.0 because the KEDA operator calls the pod IP "
        "through a Service.",
    )
    port: Port = Field(
        default=6000,
        description="gRPC port. 6000 is the port of KEDA's external-scaler samples and docs.",
    )
    tls: KedaTLS = Field(default_factory=KedaTLS, description="TLS / mutual TLS of the gRPC port.")
    push_interval_seconds: Seconds = Field(
        default=15.0,
        ge=1,
        le=600,
        description="external-push: StreamIsActive re-evaluates each stream after every cache refresh, and "
        "at least this often (the only trigger with adapter.cache.mode per_request). 15 s is the cache's "
        "default refresh interval.",
    )
    max_streams: PositiveCount = Field(
        default=20000,
        description="Open push streams allowed at once, StreamIsActive and StreamMetricSpec together (KEDA "
        "2.21 opens both per external-push trigger, so the default serves 10,000 such triggers); more are "
        "refused with RESOURCE_EXHAUSTED and KEDA retries with backoff. Bounds the memory a misbehaving "
        "client can pin.",
    )


class AdapterConfig(PrometheusAdapterRules):
    """The metrics API server: listener, TLS, authentication, metric discovery and caching."""

    rules_file: Path | None = Field(
        default=None,
        description="An existing prometheus-adapter config file (rules / externalRules / resourceRules), "
        "loaded unchanged and appended after the inline rules. Relative paths are relative to this file.",
    )
    presets: Presets = Field(default_factory=Presets, description="Built-in GPU and QPS metrics.")
    bind_address: str = Field(
        default="0.0.0.0",
        description="Address the HTTPS listener binds; 0.0.0.0 because the aggregator calls the pod IP.",
    )
    secure_port: Port = Field(
        default=6443,
        description="HTTPS port for the metrics APIs, /metrics and probes. 6443 matches prometheus-adapter's "
        "manifests, so existing Services and APIServices keep working.",
    )
    insecure_port: Port | None = Field(
        default=None,
        description="Plain-HTTP port for local use, bound to 127.0.0.1 only and logged as a warning. "
        "null: none.",
    )
    tls: ServingTLS = Field(default_factory=ServingTLS, description="Serving certificate.")
    authentication: Authentication = Field(default_factory=Authentication, description="Authn/authz.")
    relist_interval_seconds: Seconds = Field(
        default=60.0,
        description="Seconds between series discoveries (one /api/v1/series call per distinct "
        "seriesQuery). 60 s is prometheus-adapter's reference deployment: a new metric appears within a "
        "minute.",
    )
    metrics_max_age_seconds: Seconds | None = Field(
        default=None,
        description="Series discovery looks back this many seconds. null: relist_interval_seconds. Must "
        "be at least the relist interval and the Prometheus scrape interval, or metrics flap.",
    )
    max_sample_age_seconds: Seconds = Field(
        default=120.0,
        description="A Prometheus sample older than this is not served: its exporter is likely gone. 120 s "
        "is four 30 s scrape intervals.",
    )
    cache: MetricCache = Field(default_factory=MetricCache, description="Demand-driven cache.")
    keda: KedaScaler = Field(
        default_factory=KedaScaler, description="KEDA external scaler (gRPC), from the same cache."
    )

    @model_validator(mode="after")
    def _listeners_and_ages(self) -> AdapterConfig:
        if self.insecure_port is not None and self.insecure_port == self.secure_port:
            raise FieldError("insecure_port", f"must differ from secure_port ({self.secure_port})")
        if self.keda.enabled and self.keda.port in (self.secure_port, self.insecure_port):
            raise FieldError(
                "keda.port", f"must differ from secure_port and insecure_port ({self.keda.port})"
            )
        if (
            self.metrics_max_age_seconds is not None
            and self.metrics_max_age_seconds < self.relist_interval_seconds
        ):
            raise FieldError(
                "metrics_max_age_seconds",
                f"max age must not be less than relist interval ({self.relist_interval_seconds:g} s); "
                "raise it or set null",
            )
        return self
