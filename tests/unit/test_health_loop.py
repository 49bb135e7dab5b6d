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
