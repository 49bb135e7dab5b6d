"""Kubernetes access: the only package in gpuwarden that talks to the API server.

Why a package: config loading and the async raw-JSON client (`client`), list+watch informers (`watch`),
patch helpers with conflict retry (`patch`), events.k8s.io/v1 Events (`events`) and their off-path writer
(`event_queue`), Lease leader election (`leader`) and the native-async HTTP underneath (`transport`,
`stream`) are separate concepts, but they share one choke point — `KubeClient` — so third-party
exceptions never leak (they become `gpuwarden.errors.KubeError`s) and the event loop never blocks.
Nothing here knows about GPUs, taints or quarantine; domain code builds on these generic pieces.
"""

from gpuwarden.kube.client import KubeClient, load_configuration
from gpuwarden.kube.events import EventRecorder, EventType, ObjectRef, correlate, micro_time
from gpuwarden.kube.leader import (
    LeaderElector,
    LeaseAction,
    LeaseDurations,
    LeaseSnapshot,
    decide_lease,
    lease_spec,
    release_spec,
    should_step_down,
    snapshot_of,
)
from gpuwarden.kube.metadata import MetadataSource
from gpuwarden.kube.metrics import KubeMetrics, kube_metrics
from gpuwarden.kube.patch import (
    patch_status,
    patch_with_retry,
    status_patch,
    update_with_retry,
    with_precondition,
)
from gpuwarden.kube.protosource import ProtobufSource
from gpuwarden.kube.resources import (
    CONFIG_MAPS,
    CORE_EVENTS,
    DEPLOYMENTS,
    EVENTS,
    HPAS,
    LEASES,
    LIVE_PODS,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    REPLICASETS,
    RESOURCE_QUOTAS,
    STATEFULSETS,
    JsonObject,
    ObjectList,
    PatchType,
    Resource,
    json_pointer,
    object_key,
    resource_version,
)
from gpuwarden.kube.stream import AnyWatchStream, AsyncWatchStream, WatchStream
from gpuwarden.kube.watch import (
    ADDED,
    DELETED,
    MODIFIED,
    SYNCED,
    Backoff,
    Informer,
    WatchEvent,
    apply_event,
    diff_relist,
)

__all__ = [
    "ADDED",
    "CONFIG_MAPS",
    "CORE_EVENTS",
    "DELETED",
    "DEPLOYMENTS",
    "EVENTS",
    "HPAS",
    "LEASES",
    "LIVE_PODS",
    "MODIFIED",
    "NAMESPACES",
    "NODES",
    "PDBS",
    "PODS",
    "REPLICASETS",
    "RESOURCE_QUOTAS",
    "STATEFULSETS",
    "SYNCED",
    "AnyWatchStream",
    "AsyncWatchStream",
    "Backoff",
    "EventRecorder",
    "EventType",
    "Informer",
    "JsonObject",
    "KubeClient",
    "KubeMetrics",
    "LeaderElector",
    "LeaseAction",
    "LeaseDurations",
    "LeaseSnapshot",
    "MetadataSource",
    "ObjectList",
    "ObjectRef",
    "PatchType",
    "ProtobufSource",
    "Resource",
    "WatchEvent",
    "WatchStream",
    "apply_event",
    "correlate",
    "decide_lease",
    "diff_relist",
    "json_pointer",
    "kube_metrics",
    "lease_spec",
    "load_configuration",
    "micro_time",
    "object_key",
    "patch_status",
    "patch_with_retry",
    "release_spec",
    "resource_version",
    "should_step_down",
    "snapshot_of",
    "status_patch",
    "update_with_retry",
    "with_precondition",
]
