"""Expected transient failures are logged once per episode at warning (no traceback) and counted each time;
anything else keeps its traceback."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from controller.app import PassScheduler
from gpuwarden.errors import (
    KubeConflict,
    KubeForbidden,
    KubeGone,
    KubeNotFound,
    KubeUnreachable,
    PrometheusBadQuery,
    PrometheusUnreachable,
)
from gpuwarden.transient import Episodes, transient_cause, transient_counter


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        pytest.param(KubeUnreachable("connection refused"), "api-unreachable", id="refused"),
        pytest.param(KubeUnreachable("too many requests", status=429), "api-throttled", id="429"),
        pytest.param(KubeUnreachable("etcd timeout", status=503), "api-server-error", id="503"),
        pytest.param(KubeGone("too old resource version", status=410), "watch-expired", id="410"),
        pytest.param(KubeConflict("conflict", status=409), "conflict", id="409"),
        pytest.param(PrometheusUnreachable("down"), "prometheus", id="prometheus-down"),
        pytest.param(KubeForbidden("rbac", status=403), None, id="403-is-a-bug"),
        pytest.param(KubeNotFound("gone", status=404), None, id="404"),
        pytest.param(PrometheusBadQuery("parse error"), None, id="bad-query"),
        pytest.param(ValueError("bug"), None, id="a-bug"),
    ],
)
def test_transient_cause(exc: BaseException, cause: str | None) -> None:
    assert transient_cause(exc) == cause


def count(registry: CollectorRegistry, component: str, cause: str) -> float:
    value = registry.get_sample_value(
        "gpuwarden_transient_failures_total", {"component": component, "cause": cause}
    )
    return value or 0.0


def test_one_warning_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    log = logging.getLogger("test.transient")
    episodes = Episodes(transient_counter(registry), log)
    with caplog.at_level(logging.INFO, logger="test.transient"):
        for _ in range(5):
            assert episodes.failed("health", KubeUnreachable("refused"))
        assert episodes.failed("health", KubeUnreachable("503", status=503))  # the cause changed
        episodes.succeeded("health")
        episodes.succeeded("health")
        assert episodes.failed("health", KubeUnreachable("refused"))  # a new episode
        assert not episodes.failed("health", ValueError("bug"))
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("WARNING", "health: api-unreachable; retried, logged again when it ends or its cause changes"),
        ("WARNING", "health: api-server-error; retried, logged again when it ends or its cause changes"),
        ("INFO", "health: recovered from api-server-error"),
        ("WARNING", "health: api-unreachable; retried, logged again when it ends or its cause changes"),
    ]
    assert count(registry, "health", "api-unreachable") == 6
    assert count(registry, "health", "api-server-error") == 1


async def test_pass_scheduler_logs_an_outage_once_and_a_bug_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    leading = asyncio.Event()
    leading.set()
    errors: list[BaseException] = [KubeUnreachable("refused")] * 4 + [ValueError("bug")]

    async def run_once(_: asyncio.Event) -> None:
        raise errors.pop(0)

    passes = PassScheduler(leading, registry=registry)
    passes.every("health", 3600.0, run_once, lambda: True)
    (job,) = passes.scheduler.get_jobs()
    with caplog.at_level(logging.INFO, logger="controller.app"):
        for _ in range(5):
            await job.func()
    records = [r for r in caplog.records if r.name == "controller.app"]
    assert [r.levelname for r in records] == ["WARNING", "ERROR"]
    assert records[0].exc_info is None and records[1].exc_info is not None
    assert count(registry, "health", "api-unreachable") == 4
