"""The `kubernetes:` section — how both deployables reach the API server, and leader election.

Consumed by `gpuwarden.kube`, the single choke point for Kubernetes API traffic, and by the controller's
leader elector. Cluster facts shared by several loops (the GPU extended-resource name) live here too, so the
health loop, the extender and the nomination loop cannot disagree about what a GPU node is.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import DnsLabel, FieldError, PositiveCount, QualifiedName, Seconds


class LeaderElection(Section):
    """A coordination.k8s.io Lease so only one controller replica mutates the cluster at a time.

    The timings are client-go's defaults (15 s / 10 s / 2 s), which every Kubernetes controller uses: a dead
    leader is replaced within about 15 s, and a leader that cannot renew for 10 s stops acting before its
    lease could be taken over.
    """

    enabled: bool = Field(
        default=True,
        description="Run the mutating loops only while holding the Lease. Turn off only for a single "
        "replica in development: two un-elected replicas would both taint and clear nominations.",
    )
    lease_name: DnsLabel = Field(
        default="gpuwarden-controller",
        description="Name of the coordination.k8s.io/v1 Lease. Distinct per controller deployment sharing "
        "a namespace.",
    )
    lease_namespace: DnsLabel | None = Field(
        default=None,
        description="Namespace of the Lease. null: the pod's own namespace (from the service-account "
        "mount), which is where its RBAC allows writing Leases.",
    )
    identity: str | None = Field(
        default=None,
        description="Holder identity written into the Lease. null: `<hostname>_<random>`, unique per "
        "process so a restarted pod never mistakes an old lease for its own.",
    )
    lease_duration_seconds: Seconds = Field(
        default=15.0,
        description="Seconds a lease is valid after its last renewal; a standby takes over this long after "
        "the leader dies. client-go default.",
    )
    renew_deadline_seconds: Seconds = Field(
        default=10.0,
        description="Seconds the leader keeps trying to renew before it gives up leadership and stops "
        "acting. Must be shorter than lease_duration_seconds. client-go default.",
    )
    retry_period_seconds: Seconds = Field(
        default=2.0,
        description="Seconds between acquire/renew attempts. client-go default.",
    )

    @model_validator(mode="after")
    def _timings_ordered(self) -> LeaderElection:
        if not self.renew_deadline_seconds < self.lease_duration_seconds:
            raise FieldError(
                "renew_deadline_seconds",
                "must be less than lease_duration_seconds, or a standby can take "
                "the lease while the old leader still acts; e.g. 10 and 15",
            )
        if not self.retry_period_seconds < self.renew_deadline_seconds:
            raise FieldError(
                "retry_period_seconds",
                "must be less than renew_deadline_seconds so at least one renewal is "
                "attempted before the deadline; e.g. 2 and 10",
            )
        return self


class KubernetesConfig(Section):
    """How to reach the API server and how hard to lean on it."""

    kubeconfig: Path | None = Field(
        default=None,
        description="Path to a kubeconfig file. null: in-cluster config when running in a pod, otherwise "
        "$KUBECONFIG or ~/.kube/config (the same order kubectl uses).",
    )
    context: str | None = Field(
        default=None,
        description="kubeconfig context to use. null: the file's current-context.",
    )
    namespace: DnsLabel | None = Field(
        default=None,
        description="Namespace gpuwarden runs in (Leases, its own Events). null: read from the "
        "service-account mount, falling back to 'default' outside a pod.",
    )
    request_timeout_seconds: Seconds = Field(
        default=30.0,
        description="Client-side timeout in seconds for one non-watch API request. 30 s is long enough for "
        "a paged LIST of 5,000 nodes on a busy API server and short enough to notice an outage.",
    )
    watch_timeout_seconds: Seconds = Field(
        default=300.0,
        description="Server-side `timeoutSeconds` of each watch; the watch is then re-opened from the last "
        "resourceVersion. 5 min keeps connections fresh across API-server restarts and load-balancer idle "
        "timeouts without relisting.",
    )
    list_page_size: PositiveCount = Field(
        default=500,
        le=10_000,
        description="`limit` for paged LISTs (items per page). 500 is kubectl's and client-go's default; it "
        "keeps each response small enough for the API server's memory at 10,000 pods.",
    )
    protobuf: bool = Field(
        default=True,
        description="List and watch as protobuf (`application/vnd.kubernetes.protobuf`, as client-go does) "
        "where gpuwarden reads a few fields of many objects: the controller's shared pod informer and the "
        "extender's own pod feed. kube-scheduler watches pods as protobuf, so the API server encodes each "
        "pod event once instead of once more as JSON. false: JSON everywhere. Through a proxy, and for "
        "kinds a server only serves as JSON, JSON is used anyway.",
    )
    qps: float = Field(
        default=50.0,
        gt=0,
        description="Sustained client-side rate limit for API writes and LISTs, in requests per second. "
        "Watches are not counted. 50 is controller-runtime's default.",
    )
    burst: PositiveCount = Field(
        default=100,
        description="Burst allowed above `qps` (token-bucket size). controller-runtime's default.",
    )
    field_manager: str = Field(
        default="gpuwarden",
        min_length=1,
        max_length=128,
        description="fieldManager sent with every patch, so `kubectl get -o yaml --show-managed-fields` "
        "shows which fields gpuwarden owns.",
    )
    gpu_resource_name: QualifiedName = Field(
        default="nvidia.com/gpu",
        description="Extended resource that counts GPUs. A node with a non-zero capacity of it is a GPU "
        "node (the breaker's denominator; the extender's candidates). nvidia.com/gpu is what NVIDIA's "
        "device plugin advertises.",
    )
    leader_election: LeaderElection = Field(
        default_factory=LeaderElection, description="Leader election for the controller's mutating loops."
    )

    @model_validator(mode="after")
    def _burst_covers_qps(self) -> KubernetesConfig:
        if self.burst < self.qps:
            raise FieldError(
                "burst", f"must be at least qps ({self.qps:g}), got {self.burst}; e.g. burst = 2 x qps"
            )
        return self
