"""Remediation hand-off as a table: start after the drain, escalate on timeout or failure, succeed on release
or on the object's condition, end exhausted; a released node has its markers removed at once."""

from __future__ import annotations

import pytest

from controller.drain.remediation import (
    NodeRemediation,
    RemediationState,
    StepOutcome,
    decide,
    decode,
    render_template,
)
from gpuwarden.config.remediation import RemediationConfig

POLICY = RemediationConfig.model_validate(
    {
        "enabled": True,
        "steps": [
            {"name": "gpu-reset", "action": "object", "resource": "gpuresets", "timeout_seconds": 600,
             "template": "apiVersion: e2e.gpuwarden.io/v1\nkind: GPUReset\n"
                         "metadata: {name: '{node}-reset'}\nspec: {uuids: '{gpus}'}\n"},
            {"name": "reboot", "action": "label", "key": "remediation.example.com/reboot",
             "timeout_seconds": 900},
            {"name": "replace", "action": "annotation", "key": "remediation.example.com/replace",
             "timeout_seconds": 900},
        ],
    }
)  # fmt: skip
NOW = 10_000.0


def node(quarantined: bool = True, done: bool = True, state: RemediationState | None = None,
         condition: bool | None = None) -> NodeRemediation:  # fmt: skip
    return NodeRemediation(
        "n1", quarantined, done, state, condition=condition, gpus=("GPU-2",), reason="xid-79"
    )


@pytest.mark.parametrize(
    ("n", "apply", "remove", "final", "event"),
    [
        pytest.param(node(done=False), None, (), None, None, id="waits-for-the-drain"),
        pytest.param(node(quarantined=False), None, (), None, None, id="healthy-node-nothing"),
        pytest.param(node(), "gpu-reset", (), "", "GPURemediationStarted", id="starts-the-first-step"),
        pytest.param(node(state=RemediationState(0, NOW - 10)), None, (), None, None, id="step-in-progress"),
        pytest.param(node(state=RemediationState(0, NOW - 10), condition=True), None, (), "succeeded",
                     "GPURemediationSucceeded", id="object-condition-true"),
        pytest.param(node(state=RemediationState(0, NOW - 10), condition=False), "reboot", (), "",
                     "GPURemediationEscalated", id="object-condition-false-escalates"),
        pytest.param(node(state=RemediationState(0, NOW - 601)), "reboot", (), "", "GPURemediationEscalated",
                     id="timeout-escalates"),
        pytest.param(node(state=RemediationState(1, NOW - 901)), "replace", ("reboot",), "",
                     "GPURemediationEscalated", id="label-step-marker-removed-on-escalation"),
        pytest.param(node(state=RemediationState(2, NOW - 901)), None, ("reboot", "replace"), "exhausted",
                     "GPURemediationExhausted", id="last-step-times-out-exhausted"),
        pytest.param(node(quarantined=False, state=RemediationState(1, NOW - 5)), None, ("reboot",),
                     "succeeded", "GPURemediationSucceeded", id="release-mid-step-succeeds"),
        pytest.param(node(state=RemediationState(2, NOW - 5, final="exhausted")), None, (), None, None,
                     id="exhausted-stays-for-a-human"),
    ],
)  # fmt: skip
def test_decide(n: NodeRemediation, apply: str | None, remove: tuple[str, ...], final: str | None,
                event: str | None) -> None:  # fmt: skip
    d = decide(n, POLICY, NOW)
    if event is None:
        assert d is None
        return
    assert d is not None and d.event is not None and d.event[0] == event
    assert (d.apply.name if d.apply else None) == apply
    assert tuple(s.name for s in d.remove) == remove
    assert d.state is not None and d.state.final == final


def test_released_after_the_end_forgets_the_state() -> None:
    d = decide(node(quarantined=False, state=RemediationState(2, NOW - 5, final="exhausted")), POLICY, NOW)
    assert d is not None and d.state is None and d.apply is None


def test_disabled_or_unreadable_does_nothing() -> None:
    assert decide(node(), RemediationConfig(), NOW) is None
    unreadable = NodeRemediation("n1", True, True, None, readable=False)
    assert decide(unreadable, POLICY, NOW) is None


def test_state_round_trip_and_template() -> None:
    st = RemediationState(
        1, 100.0, (StepOutcome("gpu-reset", "timed-out", 700.0, "no success"),), "", "/apis/x"
    )
    assert decode(st.encode()) == st
    assert decode("garbage") is None
    obj = render_template(POLICY.steps[0].template, {"node": "n1", "gpus": "GPU-2", "step": "gpu-reset"})
    assert obj["metadata"]["name"] == "n1-reset" and obj["spec"]["uuids"] == "GPU-2"
    with pytest.raises(ValueError, match="apiVersion and kind"):
        render_template("just: text", {})


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="required for a label step"):
        RemediationConfig.model_validate({"enabled": True, "steps": [{"name": "a", "action": "label"}]})
    with pytest.raises(ValueError, match="apiVersion and kind"):
        RemediationConfig.model_validate(
            {
                "enabled": True,
                "steps": [{"name": "a", "action": "object", "template": "x: 1", "resource": "xs"}],
            }
        )
    with pytest.raises(ValueError, match="is not YAML"):
        RemediationConfig.model_validate(
            {
                "enabled": True,
                "steps": [{"name": "a", "action": "object", "template": "a: [", "resource": "xs"}],
            }
        )
    with pytest.raises(ValueError, match="the kind's plural"):
        RemediationConfig.model_validate(
            {
                "enabled": True,
                "steps": [{"name": "a", "action": "object", "template": "apiVersion: v1\nkind: X"}],
            }
        )
    with pytest.raises(ValueError, match="at least one step"):
        RemediationConfig.model_validate({"enabled": True})
