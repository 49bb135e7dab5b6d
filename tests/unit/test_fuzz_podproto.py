"""Differential fuzzing: the protobuf pod decoder (`controller.gpus.podproto`) against the JSON path.

The promise (issue 44): a pod read from the API server's protobuf gives the object its JSON gives - the
decoded part of it (`podproto_support.decoded_part`), with JSON's values and omissions - and so the same
`PodInfo` every GPU reader builds. Pods are generated in the API server's JSON shape (strings of any text,
quantities, times, maps, owner references, tolerations, claims, conditions), encoded as the API server's
protobuf with the fields the subset message skips (`podproto_support.pod_bytes`). Then the bytes are
mutated: the decoder gives an object or a `PodDecodeError`, nothing else. Derandomized: the same cases
every run.

The GPU model's own feed decodes a pod straight into its `PodInfo` (`podproto.decoded_pod`, issue 47):
on every generated and mutated pod it must give what `pod_info` of `pod_object` gives, and refuse the
bytes `pod_object` refuses.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.gpus.objects import pod_info
from controller.gpus.podproto import PodDecodeError, decoded_pod, pod_object
from gpuwarden.wellknown import (
    GPU_CLAIMED_AT,
    GPU_IDS,
    GPU_NODE,
    GPU_RESERVED_UNTIL,
    IDLE_ACK_UNTIL,
    IDLE_RECLAIMABLE,
    TOPOLOGY_POLICY,
)
from tests.unit.extender_support import RESOURCE
from tests.unit.podproto_support import decoded_part, pod_bytes

SETTINGS: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "derandomize": True,
    "suppress_health_check": list(HealthCheck),
}
GENERATED_EXAMPLES = 400
MUTATED_EXAMPLES = 500

TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
NAME = st.one_of(st.sampled_from(["main", "a", "gpuwarden.io/gpu-ids", RESOURCE]), TEXT)
QUANTITY = st.sampled_from(["0", "1", "2", "8", "500m", "1Gi", "1.5", "x", "-1", "1e3"])
TIME = st.integers(1, 4_102_444_800).map(lambda s: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s)))
MAP = st.dictionaries(NAME, st.one_of(TEXT, st.just("")), min_size=1, max_size=3)
# the annotations the GPU model reads (objects.read_pod_info), with values it can and cannot read
MODEL_KEY = st.sampled_from(
    [GPU_IDS, GPU_NODE, GPU_CLAIMED_AT, GPU_RESERVED_UNTIL, TOPOLOGY_POLICY, IDLE_RECLAIMABLE, IDLE_ACK_UNTIL]
)
MODEL_VALUE = st.sampled_from(["0,1", "3", "node-a", "1700000000.5", "true", "2026-12-07T22:00:00Z", "x", ""])
ANNOTATIONS = st.one_of(MAP, st.dictionaries(MODEL_KEY, MODEL_VALUE | TEXT, min_size=1, max_size=5))


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict holding any subset of `fields` (JSON omits an empty or absent field)."""
    return st.fixed_dictionaries({}, optional=fields)


def with_required(required: dict[str, st.SearchStrategy[Any]], **fields: st.SearchStrategy[Any]) -> Any:
    return st.fixed_dictionaries(required, optional=fields)


RESOURCE_NAME = st.just(RESOURCE) | NAME  # the GPU resource often: sidecars and init steps must count alike
RESOURCES = optional(
    limits=st.dictionaries(RESOURCE_NAME, QUANTITY, min_size=1, max_size=3),
    requests=st.dictionaries(RESOURCE_NAME, QUANTITY, min_size=1, max_size=3),
)
CONTAINER = with_required(
    {"name": NAME, "resources": RESOURCES}, restartPolicy=st.sampled_from(["Always", "Never", "x"])
)
OWNER = with_required(
    {"apiVersion": TEXT, "kind": TEXT, "name": TEXT, "uid": TEXT},
    controller=st.booleans(),
    blockOwnerDeletion=st.booleans(),
)
TOLERATION = optional(
    key=TEXT,
    operator=st.sampled_from(["Exists", "Equal"]),
    value=TEXT,
    effect=st.sampled_from(["NoSchedule", "NoExecute"]),
    tolerationSeconds=st.integers(-(2**63), 2**63 - 1),
)
CLAIM = with_required({"name": TEXT}, resourceClaimName=TEXT, resourceClaimTemplateName=TEXT)
CONDITION = with_required(
    {
        "type": st.just("DisruptionTarget") | TEXT,
        "status": st.sampled_from(["True", "False", "Unknown"]),
        "lastTransitionTime": st.none() | TIME,
    },
    reason=st.just("PreemptionByScheduler") | TEXT,
    message=TEXT,
)
METADATA = optional(
    name=TEXT,
    namespace=TEXT,
    uid=TEXT,
    resourceVersion=TEXT,
    creationTimestamp=TIME,
    deletionTimestamp=TIME,
    labels=MAP,
    annotations=ANNOTATIONS,
    ownerReferences=st.lists(OWNER, min_size=1, max_size=2),
)
SPEC = with_required(
    {"containers": st.lists(CONTAINER, max_size=3)},
    initContainers=st.lists(CONTAINER, min_size=1, max_size=2),
    nodeName=TEXT,
    priority=st.integers(-(2**31), 2**31 - 1),
    nodeSelector=MAP,
    tolerations=st.lists(TOLERATION, min_size=1, max_size=2),
    resourceClaims=st.lists(CLAIM, min_size=1, max_size=2),
)
STATUS = optional(
    phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
    conditions=st.lists(CONDITION, min_size=1, max_size=3),
    startTime=TIME,
    nominatedNodeName=TEXT,
    resourceClaimStatuses=st.lists(
        with_required({"name": TEXT}, resourceClaimName=TEXT), min_size=1, max_size=2
    ),
    extendedResourceClaimStatus=st.fixed_dictionaries({"resourceClaimName": TEXT}),
)
POD = st.fixed_dictionaries({"metadata": METADATA, "spec": SPEC, "status": STATUS})  # both always written


def straight(data: bytes) -> Any:
    """`decoded_pod`'s PodInfo, or the type of its refusal."""
    try:
        return decoded_pod(data, RESOURCE).info
    except PodDecodeError:
        return PodDecodeError


def via_dict(data: bytes) -> Any:
    """`pod_info` of `pod_object`, or the type of the refusal."""
    try:
        return info(pod_object(data))
    except PodDecodeError:
        return PodDecodeError


def info(obj: dict[str, Any]) -> Any:
    try:
        return pod_info(obj, RESOURCE)
    except Exception as exc:  # both paths must fail alike, whatever the failure
        return type(exc)


@settings(max_examples=GENERATED_EXAMPLES, **SETTINGS)
@given(POD)
def test_a_pod_decodes_from_protobuf_as_its_json_reads(obj: dict[str, Any]) -> None:
    decoded = pod_object(pod_bytes(obj))
    assert decoded == decoded_part(obj)
    assert info(decoded) == info(obj)
    assert straight(pod_bytes(obj)) == info(obj)


MUTATION = st.tuples(
    st.sampled_from(["insert", "replace", "delete"]),
    st.integers(0, 1 << 16),
    st.binary(min_size=1, max_size=4),
)


@settings(max_examples=MUTATED_EXAMPLES, **SETTINGS)
@given(POD, st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_pod_bytes_decode_or_are_refused(
    obj: dict[str, Any], mutations: list[tuple[str, int, bytes]]
) -> None:
    data = bytearray(pod_bytes(obj))
    for kind, at, chunk in mutations:
        at %= len(data) + 1
        if kind == "insert":
            data[at:at] = chunk
        elif kind == "replace":
            data[at : at + len(chunk)] = chunk
        else:
            del data[at : at + len(chunk)]
    assert straight(bytes(data)) == via_dict(bytes(data))
    try:
        decoded = pod_object(bytes(data))
    except PodDecodeError:
        return
    assert only_json_values(decoded), "bytes where JSON has a string"
    info(decoded)  # whatever was decoded, the reader takes it (or fails as it would on JSON)


def only_json_values(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and only_json_values(v) for k, v in value.items())
    if isinstance(value, list):
        return all(only_json_values(v) for v in value)
    return value is None or isinstance(value, str | int | bool)
