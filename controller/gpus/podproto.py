"""A v1.Pod's protobuf bytes → the JSON-shaped dict of the fields the controller's pod readers read, and
nothing else.

Why it exists: the controller's shared live-pod informer (and the GPU model's own, standalone) lists and
watches pods as protobuf (`gpuwarden.kube.protosource`: the API server already encodes every pod event as
protobuf for kube-scheduler, and a subset message skips managedFields, volumes, env and container statuses
by length). Its readers — `objects.pod_info`, drain's observe, idle's snapshot, nominations' snapshot,
make-room's plan, the preemption signals, `devices.claim_names` — stay the readers of a pod: this module only
rebuilds the part of the pod's JSON they read, with JSON's values (a Quantity as its string, a Time as
RFC 3339 to the second, as metav1.Time marshals it, a zero Time as null) and JSON's omissions: the API
server's protobuf writes every string field of a struct, empty ones too, where its JSON omits them
(`omitempty`), so an empty string here is left out as there, and a field JSON always writes (an owner
reference's kind, a claim's name) is written here too. The same pod gives the same dict on both paths for
every decoded field (tests/unit/test_podproto.py, and the e2e comparison against a real API server). A
field a reader starts to read must be added here and in podpb/pod.proto: tests/unit/test_podproto.py
records the paths each reader reads and fails on one this module does not decode.

A string that is not UTF-8 (the API server stores what a protobuf client sent; its JSON writes each
invalid byte as U+FFFD) is written as its JSON would be, so one odd annotation cannot make the pod
unreadable - and the watch with it. Found by tests/unit/test_fuzz_podproto.py, which mutates pods' bytes.

The GPU model's own pod feed (the extender's process) has one reader only, so `decoded_pod` reads its
pods straight into the model's `PodInfo` (`objects.read_pod_info`, the one home of what the fields mean)
and builds no dict of the pod (issue 47: the dict and `pod_info` of it were a fifth of the extender's
CPU). It refuses exactly the bytes `pod_object` refuses and gives `pod_info(pod_object(raw))`:
tests/unit/test_fuzz_podproto.py holds the two paths together on generated and mutated pods.

It must not interpret anything (that is the readers' job; `decoded_pod` hands the read parts to
`objects.read_pod_info`), nor raise anything but `PodDecodeError` on bytes it cannot read. Pure: no I/O.
"""

from __future__ import annotations

import codecs
import time
from typing import Any

from google.protobuf.message import DecodeError

from controller.gpus.objects import DecodedPod, effective_request, int_value, read_pod_info
from controller.gpus.podpb.pod_pb2 import (
    Container,
    ObjectMeta,
    Pod,
    PodSpec,
    PodStatus,
    ResourceRequirements,
    Time,
)


class PodDecodeError(ValueError):
    """The bytes are not a v1.Pod message."""


def _go_json_replace(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    return "\ufffd" * (error.end - error.start), error.end  # one per byte, as Go's utf8.DecodeRune steps


codecs.register_error("gpuwarden-go-json", _go_json_replace)


def _text(value: str | bytes) -> str:
    """A string field as the API server's JSON writes it: the protobuf runtime hands a string that is not
    UTF-8 over as bytes (proto2 does not check), and Go's encoding/json writes each invalid byte as U+FFFD."""
    if type(value) is str:
        return value
    assert isinstance(value, bytes)
    return value.decode("utf-8", "gpuwarden-go-json")


def _strings(value: Any) -> dict[str, str]:
    """A map<string, string> field as JSON writes it (values as `_text`; a key that is not UTF-8 raises
    `UnicodeDecodeError` in the runtime: keys are validated names, so such a pod is refused)."""
    out = dict(value)
    for text in out.values():
        if type(text) is not str:
            return {k: _text(v) for k, v in out.items()}
    return out


FIRST_SECOND, LAST_SECOND = -62_167_219_200, 253_402_300_799
"""The Times metav1.Time can write as JSON: years 0000 to 9999 (Go's `Time.MarshalJSON` refuses the rest)."""


def _checked(value: Time) -> int:
    """A Time's seconds, refused outside the years JSON can write (`time.gmtime` raised `OSError` on some)."""
    seconds = value.seconds
    if not FIRST_SECOND <= seconds <= LAST_SECOND:
        raise PodDecodeError(f"a v1.Pod Time outside the years 0000-9999: {seconds} s")
    return seconds


def _time(value: Time) -> str | None:
    """As metav1.Time marshals to JSON: RFC 3339 in UTC to the second; the zero Time (an empty message on
    the wire) as null."""
    if not _checked(value):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value.seconds))


def _resources(value: ResourceRequirements) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if value.limits:
        out["limits"] = {name: _text(quantity.string) for name, quantity in value.limits.items()}
    if value.requests:
        out["requests"] = {name: _text(quantity.string) for name, quantity in value.requests.items()}
    return out


def _container(value: Container) -> dict[str, Any]:
    out: dict[str, Any] = {"name": _text(value.name)}
    if value.HasField("resources"):
        out["resources"] = _resources(value.resources)
    if value.restartPolicy:
        out["restartPolicy"] = _text(value.restartPolicy)
    return out


def _metadata(m: ObjectMeta) -> dict[str, Any]:
    meta: dict[str, Any] = {
        name: _text(value)
        for name in ("name", "namespace", "uid", "resourceVersion")
        if (value := getattr(m, name))
    }
    if m.HasField("creationTimestamp") and m.creationTimestamp.seconds:  # `omitzero` in JSON
        meta["creationTimestamp"] = _time(m.creationTimestamp)
    if m.HasField("deletionTimestamp"):
        meta["deletionTimestamp"] = _time(m.deletionTimestamp)
    if m.labels:
        meta["labels"] = _strings(m.labels)
    if m.annotations:
        meta["annotations"] = _strings(m.annotations)
    if m.ownerReferences:
        owners = []
        for ref in m.ownerReferences:
            owner: dict[str, Any] = {
                "apiVersion": _text(ref.apiVersion),
                "kind": _text(ref.kind),
                "name": _text(ref.name),
                "uid": _text(ref.uid),
            }
            if ref.HasField("controller"):
                owner["controller"] = ref.controller
            if ref.HasField("blockOwnerDeletion"):
                owner["blockOwnerDeletion"] = ref.blockOwnerDeletion
            owners.append(owner)
        meta["ownerReferences"] = owners
    return meta


def _spec(s: PodSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(c) for c in s.containers]}
    if s.initContainers:
        spec["initContainers"] = [_container(c) for c in s.initContainers]
    if s.nodeName:
        spec["nodeName"] = _text(s.nodeName)
    if s.HasField("priority"):
        spec["priority"] = s.priority
    if s.nodeSelector:
        spec["nodeSelector"] = _strings(s.nodeSelector)
    if s.tolerations:
        tolerations = []
        for t in s.tolerations:
            toleration: dict[str, Any] = {
                name: _text(value)
                for name in ("key", "operator", "value", "effect")
                if (value := getattr(t, name))
            }
            if t.HasField("tolerationSeconds"):
                toleration["tolerationSeconds"] = t.tolerationSeconds
            tolerations.append(toleration)
        spec["tolerations"] = tolerations
    if s.resourceClaims:
        claims = []
        for c in s.resourceClaims:
            claim: dict[str, Any] = {"name": _text(c.name)}
            if c.HasField("resourceClaimName"):
                claim["resourceClaimName"] = _text(c.resourceClaimName)
            if c.HasField("resourceClaimTemplateName"):
                claim["resourceClaimTemplateName"] = _text(c.resourceClaimTemplateName)
            claims.append(claim)
        spec["resourceClaims"] = claims
    return spec


def _status(st: PodStatus) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if st.phase:
        status["phase"] = _text(st.phase)
    if st.conditions:
        conditions = []
        for c in st.conditions:
            # type and status are always in JSON, lastTransitionTime too (a zero Time as null)
            condition: dict[str, Any] = {
                "type": _text(c.type),
                "status": _text(c.status),
                "lastTransitionTime": _time(c.lastTransitionTime),
            }
            if c.reason:
                condition["reason"] = _text(c.reason)
            if c.message:
                condition["message"] = _text(c.message)
            conditions.append(condition)
        status["conditions"] = conditions
    if st.HasField("startTime"):
        status["startTime"] = _time(st.startTime)
    if st.nominatedNodeName:
        status["nominatedNodeName"] = _text(st.nominatedNodeName)
    if st.resourceClaimStatuses:
        statuses = []
        for c in st.resourceClaimStatuses:
            claim: dict[str, Any] = {"name": _text(c.name)}
            if c.HasField("resourceClaimName"):
                claim["resourceClaimName"] = _text(c.resourceClaimName)
            statuses.append(claim)
        status["resourceClaimStatuses"] = statuses
    if st.HasField("extendedResourceClaimStatus"):
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": _text(st.extendedResourceClaimStatus.resourceClaimName)
        }
    return status


def pod_object(raw: bytes) -> dict[str, Any]:
    """The pod (its message, without the envelope) as the JSON subset its readers read: metadata (name,
    namespace, uid, resourceVersion, creationTimestamp, deletionTimestamp, labels, annotations,
    ownerReferences), spec (containers' and init containers' name, resources and restartPolicy, nodeName,
    nodeSelector, priority, tolerations, resourceClaims), status (phase, conditions' type, status, reason,
    message and lastTransitionTime, startTime, nominatedNodeName, resourceClaimStatuses,
    extendedResourceClaimStatus's resourceClaimName)."""
    pod = Pod()
    try:
        pod.ParseFromString(raw)
        obj: dict[str, Any] = {"metadata": _metadata(pod.metadata)}
        if pod.HasField("spec"):
            obj["spec"] = _spec(pod.spec)
        if pod.HasField("status"):
            obj["status"] = _status(pod.status)
    except DecodeError as exc:
        raise PodDecodeError(f"not a v1.Pod message: {exc}") from None
    except UnicodeDecodeError as exc:  # a map key that is not UTF-8 (the runtime decodes keys when iterated)
        raise PodDecodeError(f"a v1.Pod string that is not UTF-8: {exc}") from None
    return obj


def _utf8_keys(value: Any) -> None:
    """Refuse a map with a key that is not UTF-8, as `pod_object` does, without reading its values: the
    runtime iterates such a key as bytes (and raises `UnicodeDecodeError` when it is looked up)."""
    for key in value:
        if type(key) is not str:
            raise PodDecodeError(f"a v1.Pod map key that is not UTF-8: {key!r}")


def _amount(resources: ResourceRequirements, resource: str) -> int:
    """`objects._amount` of a container's protobuf resources (every key checked, as `pod_object` reads
    them)."""
    limits, requests = resources.limits, resources.requests
    _utf8_keys(limits)
    _utf8_keys(requests)
    if resource in limits:
        return int_value(_text(limits[resource].string))
    if resource in requests:
        return int_value(_text(requests[resource].string))
    return 0


def decoded_pod(raw: bytes, resource: str) -> DecodedPod:
    """The pod's message straight into the `PodInfo` the GPU model reads (`resource`: its GPU resource),
    without the dict `pod_object` builds: `pod_info(pod_object(raw), resource)`, and refused where
    `pod_object` refuses (tests/unit/test_fuzz_podproto.py holds the two paths together). The dict part
    is the metadata an informer keys it by (name, namespace, resourceVersion, as `pod_object` writes them)
    and the labels, by which the model finds a multi-pod job's siblings.
    """
    pod = Pod()
    try:
        pod.ParseFromString(raw)
        m, s, st = pod.metadata, pod.spec, pod.status
        meta: dict[str, Any] = {
            name: _text(value)
            for name in ("name", "namespace", "resourceVersion")
            if (value := getattr(m, name))
        }
        # what pod_object would refuse: a Time JSON cannot write, a map key that is not UTF-8
        if m.HasField("creationTimestamp"):
            _checked(m.creationTimestamp)
        deleting = m.HasField("deletionTimestamp") and _checked(m.deletionTimestamp) != 0
        if st.HasField("startTime"):
            _checked(st.startTime)
        _utf8_keys(m.labels)
        _utf8_keys(s.nodeSelector)
        if m.labels:  # the model indexes a multi-pod job's siblings by label (domains.job_group)
            meta["labels"] = _strings(m.labels)
        annotations = _strings(m.annotations)
        disruptions = []
        for c in st.conditions:
            _checked(c.lastTransitionTime)
            if _text(c.type) == "DisruptionTarget" and _text(c.status) == "True":
                disruptions.append(_text(c.reason))
        info = read_pod_info(
            key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            uid=_text(m.uid),
            resource_version=str(meta.get("resourceVersion", "")),
            gpus=effective_request(
                (_amount(c.resources, resource) for c in s.containers),
                [(_amount(c.resources, resource), c.restartPolicy == "Always") for c in s.initContainers],
            ),
            priority=s.priority,
            annotations=annotations,
            node_name=_text(s.nodeName),
            nominated=_text(st.nominatedNodeName),
            phase=_text(st.phase),
            deleting=deleting,
            disruptions=disruptions,
        )
    except DecodeError as exc:
        raise PodDecodeError(f"not a v1.Pod message: {exc}") from None
    except UnicodeDecodeError as exc:
        raise PodDecodeError(f"a v1.Pod string that is not UTF-8: {exc}") from None
    return DecodedPod(meta, info, resource)
