"""Validation before return to service: the Job as rendered, the config checks, and the release decision
pass by pass — start, running, succeeded → released, failed / timed out → kept and recorded, exhausted, void
when the evidence returns, dry-run — plus the act step creating the Job before the record names it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.health.act import Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import TAINT_KEY, FleetSnapshot, JobState, NodeState
from controller.health.validation import job_name, render_job
from gpuwarden.config import load_config
from gpuwarden.config.health_validation import ValidationConfig
from gpuwarden.errors import ConfigError, KubeConflict
from gpuwarden.kube import EventRecorder, KubeClient
from gpuwarden.quarantine import decode
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import VALIDATION_NODE as VALIDATION_NODE_LABEL
from tests.unit.test_health_fixtures import NOW, quarantined

TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata:
  name: ignored
  namespace: ignored
spec:
  ttlSecondsAfterFinished: 3600
  template:
    spec:
      containers:
        - name: diag
          image: nvcr.io/nvidia/cloud-native/dcgm:4.4.2
          args: ["dcgmi", "diag", "-r", "3", "--host-name", "{node}"]
          env: [{name: GPUS, value: "{gpus}"}, {name: REASON, value: "{reason}"}]
          resources: {limits: {nvidia.com/gpu: 8}}
"""
CFG = ValidationConfig(enabled=True, job_template=TEMPLATE, timeout_seconds=600, max_attempts=2)
POLICY = HealthPolicy(validation=CFG, healthy_period=1800)


def ready(**kw: Any) -> NodeState:
    """A quarantined node (xid-79 on GPU 0), evidence gone, healthy period over, rebooted."""
    n = quarantined(healthy_since=NOW - 3600, **kw)
    return replace(n, boot_id="boot-2")


def _since() -> float | None:
    rec, _ = decode(ready().annotations[RECORD_ANNOTATION])
    return rec.quarantined_at if rec is not None else None


SINCE = _since()
"""When the fixture's quarantine started: part of the validation Job's name."""


def with_record(n: NodeState, **changes: Any) -> NodeState:
    rec, _ = decode(n.annotations[RECORD_ANNOTATION])
    assert rec is not None
    return replace(n, annotations={**n.annotations, RECORD_ANNOTATION: rec.with_(**changes).encode()})


def plan(n: NodeState, policy: HealthPolicy = POLICY, now: float = NOW) -> HealthPlan:
    return plan_quarantine(FleetSnapshot(now, (n,)), policy, now)


def summary(p: HealthPlan) -> set[str]:
    return {f"{a.kind}:{a.reason}" for a in p.actions} | {f"skip:{s.reason}" for s in p.skips}


def test_render_job_pins_tolerates_and_substitutes() -> None:
    job = render_job(TEMPLATE, name="gpuwarden-validate-x-1", node="n1", gpus="GPU-a,GPU-b", reason="xid-79")
    assert job["metadata"]["name"] == "gpuwarden-validate-x-1" and "namespace" not in job["metadata"]
    assert job["metadata"]["labels"][VALIDATION_NODE_LABEL] == "n1"
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeName"] == "n1" and spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert {"key": TAINT_KEY, "operator": "Exists"} in spec["tolerations"]
    container = spec["containers"][0]
    assert container["args"][-1] == "n1"
    assert container["env"] == [
        {"name": "GPUS", "value": "GPU-a,GPU-b"},
        {"name": "REASON", "value": "xid-79"},
    ]
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600  # the operator's fields are kept


def test_job_name_is_a_dns_label_per_node_and_attempt() -> None:
    long_node = "ip-10-0-0-1.ec2.internal." + "x" * 200
    name = job_name(long_node, 3)
    assert len(name) <= 63 and name.endswith("-3") and name != job_name("other", 3)


@pytest.mark.parametrize(
    ("raw", "field", "fragment"),
    [
        pytest.param({"enabled": True}, "job_template", "required", id="enabled-without-template"),
        pytest.param({"enabled": True, "job_template": "kind: Pod\napiVersion: v1\n"}, "job_template",
                     "batch/v1 Job", id="not-a-job"),
        pytest.param({"enabled": True, "job_template": "apiVersion: batch/v1\nkind: Job\nspec: {}\n"},
                     "job_template", "containers", id="no-containers"),
        pytest.param({"enabled": True, "job_template": TEMPLATE, "max_attempts": 0}, "max_attempts", ">= 1",
                     id="zero-attempts"),
        pytest.param({"enabled": True, "job_template": TEMPLATE, "bogus": 1}, "bogus", "", id="unknown-key"),
    ],
)  # fmt: skip
def test_bad_validation_config_names_the_field(
    tmp_path: Path, raw: dict[str, Any], field: str, fragment: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"health": {"validation": raw}}))
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert [f for f, _ in err.value.problems] == [f"health.validation.{field}"]
    assert fragment in err.value.problems[0][1]


def test_disabled_validation_releases_as_before() -> None:
    assert summary(plan(ready(), HealthPolicy())) == {"release:healthy-period"}


def test_first_due_release_starts_the_job_instead() -> None:
    p = plan(ready())
    (a,) = p.actions
    assert (a.kind, a.reason, a.add_taint, a.remove_taint) == (
        "start-validation",
        "validation-started",
        None,
        None,
    )
    assert a.create_job is not None and a.create_job["metadata"]["name"] == job_name("n1", 1, SINCE)
    assert a.record is not None and a.record.validation_job == job_name("n1", 1, SINCE)
    assert (a.record.validation_started, a.record.validation_attempts) == (NOW, 1)
    assert a.event is not None and a.event.reason == "GPUValidationStarted"
    assert a.create_job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "GPU-n1-0"


RUNNING = job_name("n1", 1, SINCE)


@pytest.mark.parametrize(
    ("job", "started_ago", "expect", "event"),
    [
        pytest.param(JobState(RUNNING, "running"), 60, {"skip:validation-running"}, None, id="running"),
        pytest.param(None, 60, {"skip:validation-running"}, None, id="not-listed-yet"),
        pytest.param(JobState(RUNNING, "succeeded"), 60, {"release:healthy-period"}, "GPUQuarantineReleased",
                     id="succeeded-releases"),
        pytest.param(JobState(RUNNING, "failed", "BackoffLimitExceeded"), 60,
                     {"update-record:validation-failed"}, "GPUValidationFailed", id="failed-keeps"),
        pytest.param(JobState(RUNNING, "running"), 600, {"update-record:validation-failed"},
                     "GPUValidationFailed", id="timed-out"),
        pytest.param(None, 600, {"update-record:validation-failed"}, "GPUValidationFailed",
                     id="gone-times-out"),
        pytest.param(JobState("someone-elses", "succeeded"), 60, {"skip:validation-running"}, None,
                     id="only-the-named-job-counts"),
    ],
)  # fmt: skip
def test_validation_outcomes(
    job: JobState | None, started_ago: float, expect: set[str], event: str | None
) -> None:
    n = with_record(
        ready(), validation_job=RUNNING, validation_started=NOW - started_ago, validation_attempts=1
    )
    if job is not None:
        n = replace(n, validation_jobs={job.name: job})
    p = plan(n)
    assert summary(p) == expect
    events = [a.event.reason for a in p.actions if a.event is not None]
    assert events == ([event] if event else [])


def test_failure_is_recorded_and_the_healthy_period_restarts() -> None:
    n = with_record(ready(), validation_job=RUNNING, validation_started=NOW - 60, validation_attempts=1)
    n = replace(n, validation_jobs={RUNNING: JobState(RUNNING, "failed", "BackoffLimitExceeded: 1 failed")})
    (a,) = plan(n).actions
    assert a.remove_taint is None and a.record is not None
    assert a.record.validation_job == "" and a.record.healthy_since is None
    assert a.record.validation_failures == (f"Job {RUNNING} failed: BackoffLimitExceeded: 1 failed",)
    keys = ("validation_job", "healthy_since", "validation_failures", "validation_started")
    again = replace(with_record(n, **{k: getattr(a.record, k) for k in keys}), validation_jobs={})
    assert summary(plan(again)) == {"update-record:healthy-period-started"}  # the healthy period starts over


def test_exhausted_after_max_attempts_waits_for_an_operator() -> None:
    second = job_name("n1", 2, SINCE)
    n = with_record(ready(), validation_job=second, validation_started=NOW - 60, validation_attempts=2,
                    validation_failures=("first failed",))  # fmt: skip
    n = replace(n, validation_jobs={second: JobState(second, "failed")})
    (a,) = plan(n).actions
    assert a.event is not None and (a.event.reason, a.event.type) == ("GPUValidationExhausted", "Warning")
    done = with_record(ready(), validation_attempts=2, validation_failures=("first failed", "second failed"))
    p = plan(done)
    assert summary(p) == {"skip:validation-exhausted"}
    assert "first failed; second failed" in p.skips[0].message
    assert summary(plan(replace(done, annotations={**done.annotations, "gpuwarden.io/release": "now"}))) == {
        "release:operator-annotation"
    }


def test_evidence_returning_voids_a_running_validation() -> None:
    n = with_record(ready(per_gpu={0: {"xids": (79,)}}), validation_job=RUNNING, validation_started=NOW - 60,
                    validation_attempts=1)  # fmt: skip
    n = replace(n, validation_jobs={RUNNING: JobState(RUNNING, "succeeded")})
    (a,) = plan(n).actions
    assert a.reason == "evidence-changed" and a.record is not None
    assert a.record.validation_job == "" and a.record.healthy_since is None


def test_release_after_validation_forgets_it() -> None:
    n = with_record(ready(), validation_job=RUNNING, validation_started=NOW - 60, validation_attempts=1)
    n = replace(n, validation_jobs={RUNNING: JobState(RUNNING, "succeeded")})
    (a,) = plan(n).actions
    # the released record (its Event owed) forgets the validation, and goes once the Event exists
    assert a.remove_taint is not None and a.remove_record_after_event and a.record is not None
    assert a.record.validation_job == "" and a.record.validation_attempts == 0 and a.record.event_pending
    assert "validation Job" in a.message and "succeeded" in a.message


def test_dry_run_plans_the_same_validation() -> None:
    p = plan(ready(), replace(POLICY, dry_run=True))
    assert p.dry_run and summary(p) == {"start-validation:validation-started"}


class FakeApi:
    """Just enough of KubeClient for the act step: Nodes to patch, Jobs to create (one already exists)."""

    def __init__(self, node: dict[str, Any], existing_jobs: set[str]) -> None:
        self.node, self.existing = node, existing_jobs
        self.created: list[tuple[str, str]] = []
        self.patches: list[dict[str, Any]] = []
        self.field_manager = "test"

    async def get(self, resource: Any, name: str, **_: Any) -> dict[str, Any]:
        return {**self.node, "metadata": {**self.node["metadata"], "resourceVersion": "1"}}

    async def patch(self, resource: Any, name: str, body: Any, **_: Any) -> dict[str, Any]:
        self.patches.append(body)
        return {}

    async def create(self, resource: Any, body: Any, *, namespace: str | None = None, **_: Any) -> Any:
        if resource.plural == "jobs":
            name = body["metadata"]["name"]
            if name in self.existing:
                raise KubeConflict(f"jobs {name} already exists", status=409)
            self.created.append((str(namespace), name))
        return body


@pytest.mark.parametrize("exists", [False, True], ids=["created", "already-exists-is-ours"])
async def test_act_creates_the_job_in_the_configured_namespace_then_records_it(exists: bool) -> None:
    node_obj = {"metadata": {"name": "n1", "annotations": {}, "labels": {}}, "spec": {}}
    api = FakeApi(node_obj, {job_name("n1", 1, SINCE)} if exists else set())
    kube = cast(KubeClient, api)
    actuator = Actuator(
        kube,
        EventRecorder(kube, component="health", instance="t"),
        HealthMetrics(CollectorRegistry()),
        namespace="gpuwarden",
        job_namespace="gpu-validate",
    )
    result = await actuator.apply(plan(ready()))
    assert result.failures == 0
    assert api.created == ([] if exists else [("gpu-validate", job_name("n1", 1, SINCE))])
    (record_patch,) = [
        b for b in api.patches if "metadata" in b and RECORD_ANNOTATION in b["metadata"]["annotations"]
    ]
    rec, _ = decode(record_patch["metadata"]["annotations"][RECORD_ANNOTATION])
    assert rec is not None and rec.validation_job == job_name("n1", 1, SINCE)


async def test_dry_run_creates_no_job() -> None:
    node_obj = {"metadata": {"name": "n1", "annotations": {}, "labels": {}}, "spec": {}}
    api = FakeApi(node_obj, set())
    kube = cast(KubeClient, api)
    actuator = Actuator(kube, EventRecorder(kube, component="health", instance="t"),
                        HealthMetrics(CollectorRegistry()), namespace="gpuwarden")  # fmt: skip
    await actuator.apply(plan(ready(), replace(POLICY, dry_run=True)))
    assert api.created == [] and api.patches == []


def test_a_later_quarantine_never_takes_an_earlier_ones_job() -> None:
    """Finished Jobs stay (we never delete them): the same node's next quarantine must not find the last
    one's succeeded Job under its own name and release the node unvalidated."""
    first, later = job_name("n1", 1, 1_700_000_000.0), job_name("n1", 1, 1_700_086_400.0)
    assert first != later and len(later) <= 63
