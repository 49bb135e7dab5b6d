"""The `extender:` section — the kube-scheduler extender webhook (filter / prioritize / preempt / bind).

Why: the listener, the default topology policy and the scoring weights are deployment choices that must
match the KubeSchedulerConfiguration in deploy/ (URL prefix, TLS, timeouts). The wire protocol and the
placement logic are fixed and live in `controller/`; only what an operator may legitimately tune is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, Port, PositiveCount, Seconds

TopologyPolicy = Literal["single-numa", "prefer-numa", "single-pcie", "none"]


class ExtenderTLS(Section):
    """HTTPS for the webhook, and who may call its verbs. Without a certificate it serves plain HTTP
    (kube-scheduler's default); with `client_ca_file` the verbs need a client certificate signed by it
    (kube-scheduler's extender `tlsConfig.certFile`/`keyFile`), while the probes and /metrics on the same
    port answer without one."""

    cert_file: Path | None = Field(
        default=None,
        description="PEM serving certificate. null: plain HTTP, for a scheduler on the same pod network "
        "(set enableHTTPS: false in the scheduler's extender config). With client_ca_file it is also this "
        "replica's client certificate when it forwards bind to the binder (leader bind protocol): issue it "
        "for server and client auth. Re-read every reload_interval_seconds: a rotated pair is served to new "
        "connections without a restart.",
    )
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file.")
    client_ca_file: Path | None = Field(
        default=None,
        description="PEM bundle of the CAs whose client certificates may call the verbs (filter, "
        "prioritize, preempt, bind, and bind/forwarded between replicas): kube-scheduler's extender "
        "tlsConfig certFile/keyFile must be issued by one of them. Asked for in the TLS handshake but not "
        "required there (the kubelet's probes and Prometheus present none); a certificate presented must "
        "verify. Re-read with the pair. null: no client authentication - anyone who can reach the port can "
        "call bind; keep the NetworkPolicy of deploy/ then.",
    )
    require_client_certificate: bool = Field(
        default=True,
        description="With client_ca_file: the verbs answer 403 to a caller without a verified client "
        "certificate. false: a certificate is checked when presented but not needed - a step for rolling "
        "certificates out to the scheduler before requiring them. Without client_ca_file it has no effect.",
    )
    reload_interval_seconds: Seconds = Field(
        default=10.0,
        description="Seconds between looks at cert_file, key_file and client_ca_file for a rotation "
        "(cert-manager and the kubelet rewrite mounted Secrets in place). 10, as the adapter.",
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> ExtenderTLS:
        if (self.cert_file is None) != (self.key_file is None):
            missing = "key_file" if self.key_file is None else "cert_file"
            raise FieldError(missing, "cert_file and key_file must be set together (or both left null)")
        if self.client_ca_file is not None and self.cert_file is None:
            raise FieldError(
                "client_ca_file",
                "client certificates are asked for in the TLS handshake: set cert_file and key_file too",
            )
        return self

    def client_auth_required(self) -> bool:
        """Whether the verbs need a verified client certificate."""
        return self.client_ca_file is not None and self.require_client_certificate


class Scoring(Section):
    """How `prioritize` turns a node's best GPU set into kube-scheduler's 0-10 score."""

    fit_weight: float = Field(
        default=2.0,
        ge=0,
        description="Weight of tightest fit (fewest free GPUs left stranded on the node). Twice locality "
        "by default: fragmentation is what makes the next 8-GPU job unschedulable.",
    )
    locality_weight: float = Field(
        default=1.0, ge=0, description="Weight of NVLink / PCIe-switch locality of the chosen GPU set."
    )
    error_trend_penalty: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Points subtracted (of 10) for a node whose correctable errors are rising, so work "
        "drifts away before a hard failure without ruling the node out.",
    )
    error_trend_sbe_per_hour: float = Field(
        default=10.0,
        gt=0,
        description="Single-bit ECC errors per hour (summed over the node's GPUs) that count as rising. "
        "10 is DCGM's (placeholder) SBE-rate limit.",
    )
    error_trend_refresh_seconds: Seconds = Field(
        default=60.0,
        description="Seconds between Prometheus reads of error trends; scoring never waits on Prometheus.",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> Scoring:
        if self.fit_weight == 0 and self.locality_weight == 0:
            raise FieldError("fit_weight", "fit_weight and locality_weight cannot both be 0")
        return self


class ExtenderConfig(Section):
    """The scheduler-extender webhook served by every controller replica."""

    enabled: bool = Field(default=True, description="Serve the extender webhook in the controller.")
    bind_address: str = Field(default="0.0.0.0", description="Address the webhook listener binds.")
    port: Port = Field(
        default=8888,
        description="Webhook port; /metrics and the probes are served here too. 8888 as in the "
        "gpushare and HAMi scheduler configs.",
    )
    path_prefix: str = Field(
        default="/gpuwarden",
        description="URL path before /filter, /prioritize, /preempt, /bind; must match the scheduler's "
        "urlPrefix.",
    )
    tls: ExtenderTLS = Field(default_factory=ExtenderTLS, description="Serving certificate.")
    lean_http: bool = Field(
        default=True,
        description="Answer the scheduler's plain requests (POST to a verb's path, HTTP/1.1, a "
        "Content-Length body) on a lean HTTP path beside aiohttp on the same port: about half the "
        "server's CPU per request. Any other request (probes, /metrics, chunked bodies, HTTP/1.0) is "
        "aiohttp's either way. false: every request through aiohttp.",
    )
    default_policy: TopologyPolicy = Field(
        default="single-numa",
        description="Policy for multi-GPU pods without a gpuwarden.io/topology-policy annotation. "
        "single-numa: a GPU set split across NUMA nodes loses 15-50 % of its speed. Single-GPU pods "
        "always use none.",
    )
    topology_source: Literal["auto", "nrt", "annotation"] = Field(
        default="auto",
        description="Where GPU topology comes from: the NodeResourceTopology CRD (nrt), the "
        "gpuwarden.io/gpu-topology node annotation, or auto (NRT when the CRD is installed).",
    )
    count_nominated_pods: bool = Field(
        default=True,
        description="Treat GPUs wanted by pending pods nominated to a node (priority >= the incoming pod's) "
        "as taken, as the scheduler's own filters do; the scheduler tells extenders nothing about them.",
    )
    max_request_bytes: PositiveCount = Field(
        default=64 * 1024 * 1024,
        description="Largest request body accepted, in bytes. 64 MiB: with nodeCacheCapable false the "
        "scheduler sends whole Node objects for up to 500 candidates.",
    )
    scoring: Scoring = Field(default_factory=Scoring, description="Prioritize scoring.")
    claim_ttl_seconds: Seconds = Field(
        default=60.0,
        ge=5,
        le=3600,
        description="Seconds an unbound pod's GPU claim (written by bind just before the Binding) holds "
        "its GPUs against other binds. 60: a bind takes milliseconds and a failed one is retried within "
        "seconds, while a crashed binder's claim must not pin GPUs for long. Bounds 5-3600: shorter than "
        "a slow API server's bind risks handing a GPU out twice; longer pins GPUs after a crash.",
    )
    claim_watch_timeout_seconds: float = Field(
        default=2.0,
        ge=0,
        le=30,
        description="After writing a claim, bind waits up to this long for the pod watch to deliver it and "
        "then checks the watch cache for an overlapping claim of another replica (a watch delivers writes "
        "in order, so every earlier claim is there); past it, or with 0, bind verifies with a consistent "
        "LIST of the node's claims instead (one more API request per bind). 2: the watch normally delivers "
        "within milliseconds; a longer wait only delays binds when the API server is overloaded.",
    )
    scheduler_http_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="kube-scheduler's httpTimeout for this extender (the chart renders both from "
        "scheduler.extender.httpTimeout). A bind still running past it is answered by nobody: the scheduler "
        "has given up and retries the pod. So each bind gets a deadline of 90 % of it: past the deadline it "
        "is cancelled before its next write (the Binding is never posted late) and its GPUs are freed; a "
        "retried bind of a pod whose bind is still running joins it; a bind that cannot finish in time at "
        "the current bind rate is refused at once. 5: the scheduler's default.",
    )
    warm_gpu_counts: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8],
        max_length=16,
        description="Request sizes (GPUs per pod, default policy) whose filter and prioritize answers are "
        "computed for every node once the caches have synced, before /readyz turns ready; the first wave "
        "of pods after a restart then does not pay for them (at 5,000 nodes x 4 sizes: 20,000 answers, "
        "about 20 per pod of the first 1,000). Answers for other sizes are computed on first use. [] "
        "turns it off.",
    )
    events: bool = Field(
        default=True,
        description="Write Kubernetes Events on the pod at bind: GPUsAssigned (node, GPU ids, NUMA node, "
        "topology policy) and GPUBindFailed (why). Written in the background; never delays a bind.",
    )

    bind_protocol: Literal["claim", "leader"] = Field(
        default="claim",
        description="How replicas keep from handing a GPU out twice. `claim`: every replica binds; each "
        "bind writes a claim on the pod, verifies it against the other replicas' claims, then creates the "
        "Binding (three steps, two writes per pod). `leader`: only the fenced holder of the controller's "
        "Lease (`kubernetes.leader_election`) binds, writing the GPU set on the Binding itself (one write "
        "per pod); the other replicas still answer filter and prioritize and forward bind to it at "
        "`advertise_url`. While no replica holds the Lease (up to its 15 s after a leader dies), bind "
        "fails and the scheduler retries. Every replica must use the same protocol.",
    )
    advertise_url: str | None = Field(
        default=None,
        description="With bind_protocol leader: where the other replicas reach this one's extender, "
        "written into the Lease while it leads, e.g. http://10.0.0.7:8888/gpuwarden. null: "
        "http(s)://$POD_IP:<port><path_prefix> from the POD_IP environment variable (the downward API in "
        "deploy/); with neither, a follower cannot forward and fails bind with that reason.",
    )
    forward_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        le=30,
        description="With bind_protocol leader: how long a follower waits for the binder's answer to a "
        "forwarded bind. 3: a bind takes milliseconds, and the answer must come before the scheduler's "
        "own extender timeout (httpTimeout, 5 s in docs/extender.md) so it gets an Error to retry on.",
    )

    @field_validator("advertise_url")
    @classmethod
    def _url_shape(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r}: an http:// or https:// URL with the path prefix, or null")
        return value.rstrip("/") if value is not None else None

    @field_validator("warm_gpu_counts")
    @classmethod
    def _warm_counts(cls, value: list[int]) -> list[int]:
        bad = [k for k in value if not 1 <= k <= 256]
        if bad:
            raise ValueError(f"{bad}: GPUs per pod are 1-256")
        return sorted(set(value))

    @field_validator("path_prefix")
    @classmethod
    def _prefix_shape(cls, value: str) -> str:
        if value and (not value.startswith("/") or value.endswith("/")):
            raise ValueError(f"{value!r}: start with '/' and do not end with '/', e.g. /gpuwarden (or empty)")
        return value
