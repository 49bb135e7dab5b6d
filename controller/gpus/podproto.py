"""A v1.Pod's protobuf bytes → the JSON-shaped dict of the fields `objects.pod_info` reads, and nothing else.

Why it exists: the GPU model's pod feed lists and watches pods as protobuf (`gpuwarden.kube.protosource`:
the API server already encodes every pod event as protobuf for kube-scheduler, and a subset message skips
managedFields, volumes, env and container statuses by length). `pod_info` stays the one reader of a pod:
this module only rebuilds the part of the pod's JSON it reads, with JSON's values (a Quantity as its
string, a Time as RFC 3339) and JSON's omissions: the API server's protobuf writes every string field of a
struct, empty ones too, where its JSON omits them (`omitempty`), so an empty string here is left out as
there. The same pod gives the same `PodInfo` on both paths (tests/unit/test_podproto.py). A field
`pod_info` starts to read must be added here and in podpb/pod.proto.

It must not interpret anything (that is `pod_info`'s job). Pure: no I/O.
"""

from __future__ import annotations

import datetime
from typing import Any

from google.protobuf.message import DecodeError

from controller.gpus.podpb.pod_pb2 import Container, Pod, ResourceRequirements, Time


class PodDecodeError(ValueError):
    """The bytes are not a v1.Pod message."""


def _time(value: Time) -> str:
    return datetime.datetime.fromtimestamp(value.seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resources(value: ResourceRequirements) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if value.limits:
        out["limits"] = {name: quantity.string for name, quantity in value.limits.items()}
    if value.requests:
        out["requests"] = {name: quantity.string for name, quantity in value.requests.items()}
    return out


def _container(value: Container) -> dict[str, Any]:
    out: dict[str, Any] = {"name": value.name}
    if value.HasField("resources"):
        out["resources"] = _resources(value.resources)
    if value.restartPolicy:
        out["restartPolicy"] = value.restartPolicy
    return out


def pod_object(raw: bytes) -> dict[str, Any]:
    """The pod (its message, without the envelope) as the JSON subset `pod_info` reads: metadata (name,
    namespace, uid, resourceVersion, deletionTimestamp, annotations), spec (containers' and init
    containers' resources and restartPolicy, nodeName, priority), status (phase, conditions' type, status
    and reason, nominatedNodeName)."""
    pod = Pod()
    try:
        pod.ParseFromString(raw)
    except DecodeError as exc:
        raise PodDecodeError(f"not a v1.Pod message: {exc}") from None
    m, s, st = pod.metadata, pod.spec, pod.status
    meta: dict[str, Any] = {
        name: value for name in ("name", "namespace", "uid", "resourceVersion") if (value := getattr(m, name))
    }
    if m.HasField("deletionTimestamp"):
        meta["deletionTimestamp"] = _time(m.deletionTimestamp)
    if m.annotations:
        meta["annotations"] = dict(m.annotations)
    obj: dict[str, Any] = {"metadata": meta}
    if pod.HasField("spec"):
        spec: dict[str, Any] = {"containers": [_container(c) for c in s.containers]}
        if s.initContainers:
            spec["initContainers"] = [_container(c) for c in s.initContainers]
        if s.nodeName:
            spec["nodeName"] = s.nodeName
        if s.HasField("priority"):
            spec["priority"] = s.priority
        obj["spec"] = spec
    if pod.HasField("status"):
        status: dict[str, Any] = {}
        if st.phase:
            status["phase"] = st.phase
        if st.conditions:
            status["conditions"] = [
                {"type": c.type, "status": c.status, **({"reason": c.reason} if c.reason else {})}
                for c in st.conditions
            ]
        if st.nominatedNodeName:
            status["nominatedNodeName"] = st.nominatedNodeName
        obj["status"] = status
    return obj
