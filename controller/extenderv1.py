"""The scheduler-extender wire format: k8s.io/kube-scheduler/extender/v1 as pydantic models.

Why it exists: kube-scheduler speaks these types as Go structs *without* JSON tags, so the keys are the Go
field names (PascalCase, `PodUID`, `NumPDBViolations`), no field is `omitempty` (an unset pointer is sent as
`null`) and decoding is case-insensitive (upstream's `TestCompatibility` round-trips lower-cased JSON). Pods
and nodes inside are ordinary Kubernetes JSON and stay plain dicts: we read a few fields and must hand the
`Nodes` list back untouched in the non-`nodeCacheCapable` mode.

Golden files under tests/unit/golden/extender/ pin the exact bytes. This module must not know about GPUs,
topology or HTTP; it only reads and writes the shapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

JsonObject = dict[str, Any]

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10


_OBJECT, _LIST, _STRING, _INT = "an object", "a list", "a string", "an integer"
_POD_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("metadata",), _OBJECT),
    (("metadata", "name"), _STRING),
    (("metadata", "namespace"), _STRING),
    (("metadata", "uid"), _STRING),
    (("metadata", "resourceVersion"), _STRING),
    (("metadata", "creationTimestamp"), _STRING),
    (("metadata", "deletionTimestamp"), _STRING),
    (("metadata", "labels"), _OBJECT),
    (("metadata", "annotations"), _OBJECT),
    (("metadata", "ownerReferences"), _LIST),
    (("spec",), _OBJECT),
    (("spec", "nodeName"), _STRING),
    (("spec", "schedulerName"), _STRING),
    (("spec", "priority"), _INT),
    (("spec", "containers"), _LIST),
    (("spec", "initContainers"), _LIST),
    (("status",), _OBJECT),
    (("status", "phase"), _STRING),
    (("status", "nominatedNodeName"), _STRING),
    (("status", "conditions"), _LIST),
)
_IS = {
    _OBJECT: lambda v: isinstance(v, dict),
    _LIST: lambda v: isinstance(v, list),
    _STRING: lambda v: isinstance(v, str),
    _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def pod_shape_problem(pod: Any) -> str | None:
    """Why `pod` is not a v1.Pod in the fields the extender reads (JSON types only; absent or null fields
    are fine), or None. One check for every verb, so a wrong type is a 400 naming the field, never a 500
    from deep inside a decision."""
    if not isinstance(pod, dict):
        return "must be an object"
    for path, kind in _POD_FIELDS:
        value: Any = pod
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not _IS[kind](value):
            return f"{'.'.join(path)} must be {kind}, not {type(value).__name__}"
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    for key in ("labels", "annotations"):
        for name, value in (meta.get(key) or {}).items():
            if not isinstance(value, str):
                return f"metadata.{key}[{name!r}] must be a string"
    for key in ("ownerReferences",):
        if any(not isinstance(ref, dict) for ref in meta.get(key) or []):
            return f"metadata.{key}[] must be objects"
    for conds in ((pod.get("status") or {}).get("conditions") or [],):
        if any(not isinstance(c, dict) for c in conds):
            return "status.conditions[] must be objects"
    for key in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(key) or []):
            if not isinstance(container, dict):
                return f"spec.{key}[{i}] must be an object"
            resources = container.get("resources")
            if resources is None:
                continue
            if not isinstance(resources, dict):
                return f"spec.{key}[{i}].resources must be an object"
            for part in ("limits", "requests"):
                amounts = resources.get(part)
                if amounts is not None and not isinstance(amounts, dict):
                    return f"spec.{key}[{i}].resources.{part} must be an object"
                for res, amount in (amounts or {}).items():
                    if not isinstance(amount, (str, int, float)) or isinstance(amount, bool):
                        return f"spec.{key}[{i}].resources.{part}[{res!r}] must be a quantity"
    return None


def _valid_pod(pod: JsonObject) -> JsonObject:
    problem = pod_shape_problem(pod)
    if problem is not None:
        raise ValueError(f"not a v1.Pod: {problem}")
    return pod


class WireModel(BaseModel):
    """Base: PascalCase aliases on the wire, unknown keys ignored, keys matched case-insensitively."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)
    _by_lower: ClassVar[dict[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._by_lower = {(f.alias or name).lower(): f.alias or name for name, f in cls.model_fields.items()}

    @model_validator(mode="before")
    @classmethod
    def _case_insensitive_keys(cls, data: Any) -> Any:
        """Go's encoding/json matches keys case-insensitively; so do we (exact spelling wins)."""
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            canonical = cls._by_lower.get(key.lower(), key) if isinstance(key, str) else key
            if canonical in out and canonical != key:
                continue  # an exact-case key already present wins over a differently cased duplicate
            out[canonical] = value
        return out

    def to_json(self) -> bytes:
        """Compact JSON with PascalCase keys in field order and `null` for unset pointers (Go's output)."""
        return self.model_dump_json(by_alias=True).encode()


class NodeList(WireModel):
    """A v1.NodeList; only `items[].metadata.name` is read, the objects are returned as received."""

    metadata: JsonObject = Field(default_factory=dict)
    items: list[JsonObject] = Field(default_factory=list)

    def names(self) -> list[str]:
        """The node names, in order."""
        return [str((node.get("metadata") or {}).get("name", "")) for node in self.items]


class ExtenderArgs(WireModel):
    """filter and prioritize request: the pod plus candidate nodes, as `Nodes` or as `NodeNames`."""

    pod: JsonObject = Field(alias="Pod")
    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")

    _pod_shape = field_validator("pod")(_valid_pod)

    @property
    def node_cache_capable(self) -> bool:
        """True when the scheduler sent names only (`nodeCacheCapable: true`)."""
        return self.node_names is not None

    def candidate_names(self) -> list[str]:
        """`NodeNames` when sent, else the names of `Nodes.items`; empty when neither is set."""
        if self.node_names is not None:
            return list(self.node_names)
        return self.nodes.names() if self.nodes is not None else []


class ExtenderFilterResult(WireModel):
    """filter response. `FailedAndUnresolvableNodes` takes precedence: preemption would not help there."""

    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    failed_nodes: dict[str, str] | None = Field(default=None, alias="FailedNodes")
    failed_and_unresolvable_nodes: dict[str, str] | None = Field(
        default=None, alias="FailedAndUnresolvableNodes"
    )
    error: str = Field(default="", alias="Error")


class HostPriority(WireModel):
    """One node's score; integer in [0, 10], higher is better (the scheduler multiplies by weight x 10)."""

    host: str = Field(alias="Host")
    score: int = Field(alias="Score")


class HostPriorityList(RootModel[list[HostPriority]]):
    """prioritize response: a bare JSON array of `HostPriority`."""

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


_HOST_PREFIX: dict[str, str] = {}
"""`{"Host":<name JSON>,"Score":` per node name, encoded once (bounded: cleared past `_HOST_PREFIX_MAX`)."""
_HOST_PREFIX_MAX = 200_000


def _host_prefix(host: str) -> str:
    prefix = _HOST_PREFIX.get(host)
    if prefix is None:
        if len(_HOST_PREFIX) >= _HOST_PREFIX_MAX:
            _HOST_PREFIX.clear()
        prefix = '{"Host":' + json.dumps(host, ensure_ascii=False) + ',"Score":'
        _HOST_PREFIX[host] = prefix
    return prefix


def encode_host_priorities(scores: Iterable[tuple[str, int]]) -> bytes:
    """`HostPriorityList` JSON straight from (host, score) pairs: the same bytes as
    `HostPriorityList(...).to_json()`, without building a model (or even a dict) per node on the prioritize
    hot path: each host's JSON prefix is encoded once and reused."""
    prefix = _HOST_PREFIX.get
    parts = [(prefix(host) or _host_prefix(host)) + f"{score}}}" for host, score in scores]
    return ("[" + ",".join(parts) + "]").encode()


class MetaPod(WireModel):
    """A victim identified by UID only (nodeCacheCapable preemption)."""

    uid: str = Field(alias="UID")


class MetaVictims(WireModel):
    """Victims on one node by UID, in decreasing priority order."""

    pods: list[MetaPod] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class Victims(WireModel):
    """Victims on one node as full pods (non-nodeCacheCapable preemption)."""

    pods: list[JsonObject] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")

    @field_validator("pods")
    @classmethod
    def _pods_shape(cls, pods: list[JsonObject]) -> list[JsonObject]:
        for pod in pods:
            _valid_pod(pod)
        return pods

    def to_meta(self) -> MetaVictims:
        """The same victims by UID, order kept."""
        uids = [str((pod.get("metadata") or {}).get("uid", "")) for pod in self.pods]
        return MetaVictims(
            pods=[MetaPod(uid=uid) for uid in uids], num_pdb_violations=self.num_pdb_violations
        )


class ExtenderPreemptionArgs(WireModel):
    """preempt request: the preemptor and the dry run's candidate victims per node."""

    pod: JsonObject = Field(alias="Pod")
    node_name_to_victims: dict[str, Victims] | None = Field(default=None, alias="NodeNameToVictims")
    node_name_to_meta_victims: dict[str, MetaVictims] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )

    _pod_shape = field_validator("pod")(_valid_pod)

    def meta_victims(self) -> dict[str, MetaVictims]:
        """Candidates by UID whichever way they were sent (`NodeNameToMetaVictims` wins when both are)."""
        if self.node_name_to_meta_victims is not None:
            return dict(self.node_name_to_meta_victims)
        return {node: v.to_meta() for node, v in (self.node_name_to_victims or {}).items()}


class ExtenderPreemptionResult(WireModel):
    """preempt response: always UIDs, whatever the request carried."""

    node_name_to_meta_victims: dict[str, MetaVictims] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )


class ExtenderBindingArgs(WireModel):
    """bind request, built by the scheduler from its v1.Binding."""

    pod_name: str = Field(alias="PodName")
    pod_namespace: str = Field(alias="PodNamespace")
    pod_uid: str = Field(alias="PodUID")
    node: str = Field(alias="Node")


class ExtenderBindingResult(WireModel):
    """bind response; a non-empty `Error` fails the binding cycle."""

    error: str = Field(default="", alias="Error")
