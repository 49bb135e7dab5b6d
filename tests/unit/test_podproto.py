"""The same pod as JSON and as protobuf bytes gives the same `PodInfo` (the GPU model's pod feed reads
protobuf; `pod_info` stays the one reader). The protobuf bytes carry fields the subset message leaves out
(managedFields, labels, volumes, env, container statuses, ...) so skipping them is tested too; the e2e test
in tests/e2e/test_kube_access.py compares both paths on pods a real API server encodes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.gpus.objects import DecodedPod, pod_info
from controller.gpus.podpb.pod_pb2 import Pod
from controller.gpus.podproto import PodDecodeError, decoded_pod, pod_object
from gpuwarden.wellknown import GPU_IDS, GPU_RESERVED_UNTIL, IDLE_ACK_UNTIL, IDLE_RECLAIMABLE
from tests.unit.extender_support import RESOURCE, pod
from tests.unit.podproto_support import field, pod_bytes, varint_field


def with_init(obj: dict[str, Any], *containers: tuple[int, str | None]) -> dict[str, Any]:
    """`obj` with init containers of (GPUs, restartPolicy)."""
    out = copy.deepcopy(obj)
    out["spec"]["initContainers"] = [
        {"name": f"init-{i}", "resources": {"requests": {RESOURCE: str(gpus), "cpu": "500m"}}}
        | ({"restartPolicy": policy} if policy else {})
        for i, (gpus, policy) in enumerate(containers)
    ]
    return out


def annotated(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["annotations"].update(annotations)
    return out


CASES = [
    pytest.param(pod("a", 2), id="pending-2-gpus"),
    pytest.param(pod("a", 0), id="no-gpus"),
    pytest.param(pod("a", 8, node="n1", ids="0,1,2,3,4,5,6,7", priority=1000), id="bound-with-ids"),
    pytest.param(pod("a", 1, priority=0), id="priority-zero"),
    pytest.param(pod("a", 1, priority=-5), id="priority-negative"),
    pytest.param(pod("a", 4, policy="single-numa", nominated="n2"), id="policy-nominated"),
    pytest.param(pod("a", 2, claim=("n3", 1_700_000_123.5)), id="claim"),
    pytest.param(pod("a", 1, node="n1", phase="Succeeded"), id="terminated"),
    pytest.param(pod("a", 1, node="n1", deleting=True), id="deleting"),
    pytest.param(pod("a", 1, node="n1", disrupted="PreemptionByScheduler"), id="preempted"),
    pytest.param(pod("a", 1, node="n1", disrupted="EvictionByEvictionAPI"), id="disrupted-not-preempted"),
    pytest.param(with_init(pod("a", 1), (1, "Always"), (4, None)), id="sidecar-and-init-step"),
    pytest.param(with_init(pod("a", 0), (2, "Always")), id="sidecar-only"),
    pytest.param(annotated(pod("a", 2), {GPU_RESERVED_UNTIL: "1700000999.0"}), id="reservation"),
    pytest.param(annotated(pod("a", 2), {IDLE_RECLAIMABLE: "true", IDLE_ACK_UNTIL: "x"}), id="idle-marks"),
    pytest.param(annotated(pod("a", 2), {GPU_IDS: "not,ids,!"}), id="unreadable-ids"),
    pytest.param(pod("a", 1, namespace=""), id="no-namespace"),
]


@pytest.mark.parametrize("obj", CASES)
def test_protobuf_pod_gives_the_same_pod_info_as_json(obj: dict[str, Any]) -> None:
    assert pod_info(pod_object(pod_bytes(obj)), RESOURCE) == pod_info(obj, RESOURCE)


@pytest.mark.parametrize("obj", CASES)
def test_a_pod_decoded_straight_gives_the_pod_info_of_its_json(obj: dict[str, Any]) -> None:
    """Issue 47: the model's own feed decodes a pod straight into its `PodInfo`, with no dict of the pod."""
    decoded = decoded_pod(pod_bytes(obj), RESOURCE)
    assert decoded.info == pod_info(obj, RESOURCE)
    assert pod_info(decoded, RESOURCE) is decoded.info  # the model's reader takes what was decoded
    meta = obj["metadata"]
    assert decoded == {
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion", "labels") if meta.get(k)}
    }


def test_a_pod_decoded_for_another_resource_is_not_read_as_if_it_had_no_gpus() -> None:
    decoded = decoded_pod(pod_bytes(pod("a", 2)), "example.com/other")
    assert isinstance(decoded, DecodedPod) and decoded.info.gpus == 0
    with pytest.raises(ValueError, match=r"decoded for .example\.com/other."):
        pod_info(decoded, RESOURCE)  # its dict holds no spec: 0 GPUs would be a wrong answer


def _time_field(number: int, seconds: int) -> bytes:
    """A Time (seconds, field 1) in field `number`."""
    return field(number, varint_field(1, seconds % (1 << 64)))


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(field(1, _time_field(8, 253_402_300_800)), id="creation-after-9999"),
        pytest.param(field(1, _time_field(9, 1 << 62)), id="deletion-far-future"),
        pytest.param(field(1, _time_field(9, -(1 << 62))), id="deletion-far-past"),
        pytest.param(field(3, _time_field(7, -62_167_219_201)), id="start-before-year-0"),
        pytest.param(field(3, field(2, field(1, b"Ready") + _time_field(4, 1 << 40))), id="condition-time"),
        pytest.param(field(1, field(11, field(1, b"a\xad") + field(2, b"v"))), id="label-key-not-utf8"),
        pytest.param(field(1, field(12, field(1, b"a\xad") + field(2, b"v"))), id="annotation-key"),
        pytest.param(field(2, field(7, field(1, b"a\xad") + field(2, b"v"))), id="node-selector-key"),
        pytest.param(
            field(2, field(20, field(8, field(1, field(1, b"a\xad") + field(2, field(1, b"1")))))),
            id="init-container-limit-key",
        ),
        pytest.param(
            field(2, field(2, field(8, field(2, field(1, b"a\xad") + field(2, field(1, b"1")))))),
            id="container-request-key",
        ),
    ],
)
def test_what_pod_object_refuses_is_refused_decoded_straight(message: bytes) -> None:
    """Found writing the straight path (issue 47): a Time JSON cannot write made `time.gmtime` raise
    `OSError` out of the decoder (and the watch); both paths refuse such a pod, and a map key that is not
    UTF-8 in any map the dict path reads, though the model reads only some."""
    with pytest.raises(PodDecodeError):
        pod_object(message)
    with pytest.raises(PodDecodeError):
        decoded_pod(message, RESOURCE)


def test_the_first_and_last_second_json_can_write_are_read() -> None:
    for seconds in (-62_167_219_200, 253_402_300_799):
        message = field(1, field(1, b"a") + _time_field(9, seconds))
        assert pod_object(message)["metadata"]["deletionTimestamp"]
        assert decoded_pod(message, RESOURCE).info.terminating


def test_unread_fields_and_empty_strings_are_not_in_the_object() -> None:
    obj = pod_object(pod_bytes(with_init(pod("a", 2, deleting=True), (1, "Always"))))
    assert obj == {
        "metadata": {
            "name": "a",
            "namespace": "ml",
            "uid": "uid-a",
            "resourceVersion": "100",
            "deletionTimestamp": "2023-11-14T22:13:20Z",
            "labels": {"app": "a"},
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {RESOURCE: "2"}}}],
            "initContainers": [
                {
                    "name": "init-0",
                    "resources": {"requests": {RESOURCE: "1", "cpu": "500m"}},
                    "restartPolicy": "Always",
                }
            ],
        },  # no nodeName: an empty string on the wire, omitted in JSON
        "status": {"phase": "Pending"},
    }


def test_a_bookmark_is_metadata_only() -> None:
    bookmark = Pod()
    bookmark.metadata.resourceVersion = "4711"
    bookmark.metadata.annotations["k8s.io/initial-events-end"] = "true"
    assert pod_object(bookmark.SerializeToString()) == {
        "metadata": {"resourceVersion": "4711", "annotations": {"k8s.io/initial-events-end": "true"}}
    }


def test_bytes_that_are_not_a_pod_are_an_error() -> None:
    with pytest.raises(PodDecodeError):
        pod_object(b"\x0a\xff\xff")  # field 1, a length running past the end


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        pytest.param(b"n\xad", "n\ufffd", id="one-invalid-byte"),
        pytest.param(b"\xe2\x82", "\ufffd\ufffd", id="a-cut-sequence-one-per-byte"),
        pytest.param(b"\xed\xa0\x80", "\ufffd" * 3, id="a-surrogate"),
        pytest.param("caf\u00e9".encode(), "caf\u00e9", id="valid"),
    ],
)
def test_a_string_that_is_not_utf8_reads_as_the_api_servers_json_writes_it(raw: bytes, value: str) -> None:
    """Found by the differential fuzzer (tests/unit/test_fuzz_podproto.py): the protobuf runtime hands a
    non-UTF-8 string over as bytes (and a map's as `UnicodeDecodeError`); Go's JSON writes U+FFFD per
    invalid byte (issue 44)."""
    # Pod.metadata (1): ObjectMeta.name (1) and annotations (12: a map entry of key 1, value 2)
    message = field(1, field(1, raw) + field(12, field(1, b"note") + field(2, raw)))
    obj = pod_object(message)
    assert obj["metadata"]["name"] == value
    assert obj["metadata"]["annotations"] == {"note": value}


def test_a_map_key_that_is_not_utf8_is_a_decode_error() -> None:
    good = Pod()
    good.metadata.labels["ab"] = "v"
    with pytest.raises(PodDecodeError):
        pod_object(good.SerializeToString().replace(b"ab", b"a\xad"))
