"""A JSON pod as the API server's protobuf bytes, and the part of a JSON pod `podproto` decodes.

`pod_bytes` encodes a pod as the API server does: the subset message's fields from the JSON, every
non-pointer string written even when empty (its JSON omits those), a zero Time as an empty message, and
upstream fields `podpb/pod.proto` leaves out appended so the parser must skip them. `decoded_part` keeps
of a JSON pod exactly the paths `podpb/pod.proto` holds; `decoded_paths` lists those paths.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from controller.gpus.podpb.pod_pb2 import Pod

# Messages whose JSON is a scalar (a Time is a string, a Quantity too): a path ends there.
SCALAR_MESSAGES = frozenset({"Time", "Quantity"})


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2) as protobuf encodes it."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


# Fields of upstream's messages that podpb/pod.proto leaves out (k8s.io/api core/v1 and apimachinery meta/v1
# generated.proto numbers); appended to a message's bytes they merge into it, as the API server's would be.
UNREAD_META = (
    field(2, b"trainer-")  # generateName
    + varint_field(7, 3)  # generation
    + field(14, b"gpuwarden.io/e2e")  # finalizers
    + field(17, field(1, b"kube-controller-manager") + field(7, b'{"f:metadata":{}}' * 40))  # managedFields
)
UNREAD_CONTAINER = field(2, b"trainer:v1") + field(7, field(1, b"HOME") + field(2, b"/root"))  # image, env
UNREAD_SPEC = field(1, field(1, b"data")) + field(19, b"default-scheduler")  # volumes, schedulerName
UNREAD_STATUS = field(8, field(1, b"main") + varint_field(3, 1)) + field(5, b"10.0.0.1")  # statuses, hostIP


def is_path_end(f: FieldDescriptor) -> bool:
    """A field whose JSON value is read whole: a scalar, a map, a Time or a Quantity."""
    m = f.message_type
    return m is None or m.GetOptions().map_entry or m.name in SCALAR_MESSAGES


def is_repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def decoded_paths(
    message: Descriptor = Pod.DESCRIPTOR, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every JSON path the subset message holds (a list's elements share their list's path)."""
    for f in message.fields:
        path = (*prefix, f.name)
        yield path
        if not is_path_end(f):
            yield from decoded_paths(f.message_type, path)


def decoded_part(value: dict[str, Any], message: Descriptor = Pod.DESCRIPTOR) -> dict[str, Any]:
    """`value` (JSON) without what the subset message does not hold."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        f = message.fields_by_name.get(key)
        if f is None:
            continue
        if is_path_end(f):
            out[key] = item
        elif is_repeated(f):
            out[key] = [decoded_part(x, f.message_type) for x in item]
        else:
            out[key] = decoded_part(item, f.message_type)
    return out


def _as_message_json(value: Any, message: Descriptor) -> Any:
    """The decoded part of a JSON pod in the shape `json_format` reads: a Quantity as `{"string"}`, a Time
    as `{"seconds"}` (a null Time dropped here, written as an empty message by `pod_bytes`)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        f = message.fields_by_name[key]
        m = f.message_type
        if item is None:
            continue
        if m is not None and m.name == "Time":
            stamp = time.strptime(item, "%Y-%m-%dT%H:%M:%SZ")
            out[key] = {"seconds": calendar.timegm(stamp)}
        elif (
            m is not None and m.GetOptions().map_entry and m.fields_by_name["value"].message_type is not None
        ):
            out[key] = {name: {"string": str(v)} for name, v in item.items()}  # Quantity values
        elif is_path_end(f):
            out[key] = item
        elif is_repeated(f):
            out[key] = [_as_message_json(x, m) for x in item]
        else:
            out[key] = _as_message_json(item, m)
    return out


# The strings the API server's protobuf writes even when empty (non-pointer struct fields; its JSON omits
# the `omitempty` ones), by message.
_ALWAYS_WRITTEN = {
    "ObjectMeta": ("namespace", "uid"),
    "OwnerReference": ("apiVersion", "kind", "name", "uid"),
    "Container": ("restartPolicy",),
    "Toleration": ("key", "operator", "value", "effect"),
    "PodSpec": ("nodeName",),
    "PodCondition": ("reason", "message"),
    "PodStatus": ("phase", "nominatedNodeName"),
    "PodResourceClaim": ("name",),
    "PodResourceClaimStatus": ("name",),
    "PodExtendedResourceClaimStatus": ("resourceClaimName",),
}


def _write_empty(message: Any) -> None:
    for name in _ALWAYS_WRITTEN.get(message.DESCRIPTOR.name, ()):
        setattr(message, name, getattr(message, name))  # present on the wire, "" when it was absent
    if message.DESCRIPTOR.name == "PodCondition":
        message.lastTransitionTime.SetInParent()  # a non-pointer Time: an empty message when zero
    for f in message.DESCRIPTOR.fields:
        if is_path_end(f):
            continue
        if is_repeated(f):
            for item in getattr(message, f.name):
                _write_empty(item)
        elif message.HasField(f.name):
            _write_empty(getattr(message, f.name))


def pod_bytes(obj: dict[str, Any]) -> bytes:
    """The pod's protobuf message (no envelope) as the API server writes it, with upstream fields the subset
    message does not read."""
    message = json_format.ParseDict(_as_message_json(decoded_part(obj), Pod.DESCRIPTOR), Pod())
    _write_empty(message)
    containers = [
        field(number, c.SerializeToString() + UNREAD_CONTAINER)  # repeated: each element is whole
        for number, repeated in ((2, message.spec.containers), (20, message.spec.initContainers))
        for c in repeated
    ]
    message.spec.ClearField("containers")
    message.spec.ClearField("initContainers")
    return (
        message.SerializeToString()
        + field(1, UNREAD_META)
        + field(2, UNREAD_SPEC + b"".join(containers))
        + field(3, UNREAD_STATUS)
    )
