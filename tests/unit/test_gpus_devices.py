"""DRA devices from ResourceSlices, and the devices a pod holds from its claims (gpus/devices.py)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.gpus.devices import allocated_devices, claim_names, devices_by_uuid, holds_any, pod_devices
from gpuwarden.quarantine import DeviceRef

D = "gpu.nvidia.com"


def rslice(
    node: str, pool: str, generation: int, devices: dict[str, str], *, attr: str = "uuid"
) -> dict[str, Any]:
    return {
        "spec": {
            "driver": D,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {"name": n, "attributes": {attr: {"string": u}, "index": {"int": 0}}}
                for n, u in devices.items()
            ],
        }
    }


@pytest.mark.parametrize(
    ("slices", "want"),
    [
        pytest.param(
            [rslice("n1", "n1", 1, {"gpu-0": "GPU-a", "gpu-1": "GPU-b"})],
            {"GPU-a": DeviceRef(D, "n1", "gpu-0", "GPU-a"), "GPU-b": DeviceRef(D, "n1", "gpu-1", "GPU-b")},
            id="two-devices",
        ),
        pytest.param(
            [rslice("n1", "n1", 1, {"gpu-0": "GPU-a"}, attr="gpu.nvidia.com/uuid")],
            {"GPU-a": DeviceRef(D, "n1", "gpu-0", "GPU-a")},
            id="qualified-attribute",
        ),
        pytest.param([rslice("n2", "n2", 1, {"gpu-0": "GPU-a"})], {}, id="another-node"),
        pytest.param(
            [rslice("n1", "n1", 1, {"gpu-0": "GPU-old"}), rslice("n1", "n1", 2, {"gpu-0": "GPU-new"})],
            {"GPU-new": DeviceRef(D, "n1", "gpu-0", "GPU-new")},
            id="newest-generation-only",
        ),
        pytest.param([rslice("n1", "n1", 1, {"gpu-0": "GPU-a"}, attr="serial")], {}, id="no-uuid-attribute"),
    ],
)
def test_devices_by_uuid(slices: list[dict[str, Any]], want: dict[str, DeviceRef]) -> None:
    assert devices_by_uuid(slices, "n1") == want


def pod(
    spec_claims: list[dict[str, str]], statuses: list[dict[str, str]] | None = None, extended: str = ""
) -> dict[str, Any]:
    status: dict[str, Any] = {"resourceClaimStatuses": statuses or []}
    if extended:
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended, "requestMappings": []}
    return {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": {"resourceClaims": spec_claims},
        "status": status,
    }


def claim(name: str, *devices: str, allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        results = [{"request": "gpus", "driver": D, "pool": "n1", "device": d} for d in devices]
        status["allocation"] = {"devices": {"results": results}}
    return {"metadata": {"namespace": "ns", "name": name}, "status": status}


def ref(device: str) -> DeviceRef:
    return DeviceRef(D, "n1", device)


CLAIMS = {
    ("ns", c["metadata"]["name"]): c
    for c in (
        claim("direct", "gpu-0"),
        claim("p-gpu-x1", "gpu-1", "gpu-2"),
        claim("p-ext", "gpu-3"),
        claim("pending", allocated=False),
    )
}


@pytest.mark.parametrize(
    ("obj", "names", "devices"),
    [
        pytest.param(pod([]), (), frozenset(), id="no-claims"),
        pytest.param(
            pod([{"name": "g", "resourceClaimName": "direct"}]),
            ("direct",),
            {ref("gpu-0")},
            id="direct-claim",
        ),
        pytest.param(
            pod(
                [{"name": "g", "resourceClaimTemplateName": "t"}],
                [{"name": "g", "resourceClaimName": "p-gpu-x1"}],
            ),
            ("p-gpu-x1",),
            {ref("gpu-1"), ref("gpu-2")},
            id="template-claim",
        ),
        pytest.param(pod([], extended="p-ext"), ("p-ext",), {ref("gpu-3")}, id="extended-resource-claim"),
        pytest.param(
            pod([{"name": "g", "resourceClaimTemplateName": "t"}]),
            None,
            None,
            id="template-claim-not-generated-yet",
        ),
        pytest.param(
            pod([{"name": "g", "resourceClaimName": "pending"}]),
            ("pending",),
            None,
            id="unallocated-claim-unknown",
        ),
        pytest.param(
            pod([{"name": "g", "resourceClaimName": "absent"}]),
            ("absent",),
            None,
            id="claim-not-found-unknown",
        ),
    ],
)
def test_pod_devices(obj: dict[str, Any], names: tuple[str, ...] | None, devices: Any) -> None:
    assert claim_names(obj) == names
    assert pod_devices(obj, CLAIMS) == (frozenset(devices) if devices is not None else None)


def test_holds_any_compares_driver_pool_device_not_uuid() -> None:
    held = allocated_devices(claim("c", "gpu-0"))
    assert held is not None
    assert holds_any(held, [DeviceRef(D, "n1", "gpu-0", "GPU-a")])
    assert not holds_any(held, [DeviceRef(D, "n2", "gpu-0", "GPU-a")])
