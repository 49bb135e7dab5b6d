"""The quarantine loop's wiring from config: what its actuator reads and writes."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry

from controller.health.loop import HealthLoop
from controller.health.telemetry import Querier
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeNotFound
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
