"""The quarantine loop's wiring from config: what its actuator reads and writes."""

from __future__ import annotations

from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from controller.health.loop import HealthLoop
from controller.health.telemetry import Querier
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeForbidden, KubeNotFound
from gpuwarden.kube import KubeClient


class ConfigMaps:
    """Answers GET of a ConfigMap with 404 and remembers what was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str | None]] = []

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any:
        self.asked.append((name, namespace))
        raise KubeNotFound(f"configmaps {name!r} not found", status=404)


async def test_breaker_configmap_name_comes_from_the_config() -> None:
    config = Config.model_validate(
        {"kubernetes": {"namespace": "ops"}, "health": {"breaker": {"configmap_name": "gw-breaker"}}}
    )
    kube = ConfigMaps()
    loop = HealthLoop(config, cast(Querier, object()), cast(KubeClient, kube), registry=CollectorRegistry())
    assert await loop.actuator.read_breaker() is None
    assert kube.asked == [("gw-breaker", "ops")]


class Lists:
    """Answers LISTs: failed pods (or a KubeError), validation Jobs; remembers the selectors asked for."""

    def __init__(self, *, fail_pods: bool = False) -> None:
        self.fail_pods = fail_pods
        self.asked: list[tuple[str, str | None, str | None, str | None]] = []

    async def list_objects(self, resource: Any, **kw: Any) -> Any:
        from gpuwarden.errors import KubeUnreachable
        from gpuwarden.kube.resources import ObjectList

        self.asked.append(
            (resource.plural, kw.get("namespace"), kw.get("field_selector"), kw.get("label_selector"))
        )
        if resource.plural == "pods" and self.fail_pods:
            raise KubeUnreachable("connection refused")
        return ObjectList(items=[{"metadata": {"name": resource.plural}}], resource_version="1")


def loop_with(config: dict[str, Any], kube: Lists) -> HealthLoop:
    cfg = Config.model_validate(config)
    return HealthLoop(cfg, cast(Querier, object()), cast(KubeClient, kube), registry=CollectorRegistry())


async def test_failed_pods_are_listed_by_phase_and_a_failed_list_is_not_zero() -> None:
    kube = Lists()
    assert await loop_with({}, kube)._failed_pods() == [{"metadata": {"name": "pods"}}]
    assert kube.asked == [("pods", None, "status.phase=Failed", None)]
    assert await loop_with({}, Lists(fail_pods=True))._failed_pods() is None  # unknown, not "no failures"
    off = Lists()
    signal_off = {"health": {"signals": {"admission_failures": {"action": "off"}}}}
    assert await loop_with(signal_off, off)._failed_pods() is None
    assert off.asked == []  # the signal is off: no LIST at all


async def test_validation_jobs_listed_only_when_enabled_in_their_namespace() -> None:
    kube = Lists()
    assert await loop_with({}, kube)._validation_jobs() == [] and kube.asked == []
    template = (
        "apiVersion: batch/v1\nkind: Job\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n"
    )
    validation = {"enabled": True, "job_template": template, "namespace": "gpu-checks"}
    doc = {"kubernetes": {"namespace": "ops"}, "health": {"validation": validation}}
    assert await loop_with(doc, kube)._validation_jobs() == [{"metadata": {"name": "jobs"}}]
    assert kube.asked == [("jobs", "gpu-checks", None, "gpuwarden.io/validation-node")]


# --- DRA facts (docs/health.md "DRA-backed nodes") ---------------------------------------------------------


class DraLists:
    """DeviceClasses, our DeviceTaintRules (or an error) and ResourceSlices; remembers what was listed."""

    def __init__(
        self, *, rules_error: Exception | None = None, classes_error: Exception | None = None
    ) -> None:
        self.rules_error, self.classes_error = rules_error, classes_error
        self.asked: list[tuple[str, str | None]] = []

    async def list_objects(self, resource: Any, **kw: Any) -> Any:
        from gpuwarden.kube.resources import ObjectList

        self.asked.append((resource.plural, kw.get("field_selector") or kw.get("label_selector")))
        items: list[dict[str, Any]] = []
        if resource.plural == "deviceclasses":
            if self.classes_error is not None:
                raise self.classes_error
            items = [
                {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"extendedResourceName": "nvidia.com/gpu"}}
            ]
        elif resource.plural == "devicetaintrules":
            if self.rules_error is not None:
                raise self.rules_error
        elif resource.plural == "resourceslices":
            node = str(kw["field_selector"]).split("=", 1)[1]
            device = {"name": "gpu-0", "attributes": {"uuid": {"string": f"GPU-{node}-0"}}}
            pool = {"name": node, "generation": 1}
            items = [
                {"spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": pool, "devices": [device]}}
            ]
        return ObjectList(items=items, resource_version="1")


def dra_snapshot() -> Any:
    from dataclasses import replace as _replace

    from controller.health.snapshot import FleetSnapshot
    from tests.unit.test_health_fixtures import NOW, node

    loud = _replace(node("dra-loud", capacity=0), gpu_allocatable=None)  # telemetry with something to say
    quiet = _replace(node("dra-quiet", capacity=0, gpus=0), gpu_allocatable=None)
    plugin = _replace(node("plugin"), gpu_allocatable=8)  # nvidia.com/gpu allocatable: the device plugin's
    return FleetSnapshot(NOW, (loud, quiet, plugin))


async def test_dra_nodes_get_their_devices_and_the_rule_api_state() -> None:
    kube = DraLists()
    snap = await loop_with({}, kube)._with_dra(dra_snapshot())  # type: ignore[arg-type]
    by_name = {n.name: n for n in snap.nodes}
    assert snap.device_rules == "served"
    assert by_name["plugin"].dra_devices is None
    assert by_name["dra-quiet"].dra_devices == {}  # DRA-backed, nothing to say: no slice list
    assert list(by_name["dra-loud"].dra_devices or {}) == ["GPU-dra-loud-0"]
    assert ("resourceslices", "spec.nodeName=dra-loud") in kube.asked
    assert not any(r == "resourceslices" and s and "dra-quiet" in s for r, s in kube.asked)


@pytest.mark.parametrize(
    ("error", "state"),
    [
        pytest.param(KubeNotFound("devicetaintrules", status=404), "not-served", id="404-not-served"),
        pytest.param(KubeForbidden("forbidden", status=403), "unknown", id="403-unknown"),
    ],
)
async def test_rule_api_not_served_or_unknown_lists_no_slices(error: Exception, state: str) -> None:
    kube = DraLists(rules_error=error)
    snap = await loop_with({}, kube)._with_dra(dra_snapshot())  # type: ignore[arg-type]
    assert snap.device_rules == state and snap.device_rules_why
    assert not any(r == "resourceslices" for r, _ in kube.asked)


@pytest.mark.parametrize(
    ("error", "state"),
    [
        pytest.param(KubeNotFound("deviceclasses", status=404), "not-served", id="no-resource-api-at-all"),
        pytest.param(KubeForbidden("forbidden", status=403), "unknown", id="classes-unreadable-unknown"),
    ],
)
async def test_device_classes_not_listed_means_no_dra_node(error: Exception, state: str) -> None:
    kube = DraLists(classes_error=error)
    before = dra_snapshot()
    after = await loop_with({}, kube)._with_dra(before)  # type: ignore[arg-type]
    assert after.nodes == before.nodes and after.device_rules == state
    assert kube.asked == [("deviceclasses", None)]
