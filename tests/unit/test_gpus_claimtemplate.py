"""Topology policies as DRA ResourceClaimTemplates (`gpuwarden dra claim-template`)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from controller.gpus.claimtemplate import (
    NUMA_ATTRIBUTE,
    PCIE_ATTRIBUTE,
    TemplateError,
    claim_template,
    pod_usage,
)


def devices(policy: str, gpus: int = 4) -> dict[str, Any]:
    template = claim_template(gpus=gpus, policy=policy, device_class="gpu.example.com", namespace="ml")
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    assert template["metadata"]["namespace"] == "ml"
    return template["spec"]["spec"]["devices"]  # type: ignore[no-any-return]


EXACT = {"deviceClassName": "gpu.example.com", "allocationMode": "ExactCount", "count": 4}


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        (
            "single-numa",
            {
                "requests": [{"name": "gpus", "exactly": EXACT}],
                "constraints": [{"requests": ["gpus"], "matchAttribute": NUMA_ATTRIBUTE}],
            },
        ),
        (
            "Single-PCIe ",
            {
                "requests": [{"name": "gpus", "exactly": EXACT}],
                "constraints": [{"requests": ["gpus"], "matchAttribute": PCIE_ATTRIBUTE}],
            },
        ),
        (
            "prefer-numa",
            {
                "requests": [
                    {
                        "name": "gpus",
                        "firstAvailable": [{"name": "aligned", **EXACT}, {"name": "any", **EXACT}],
                    }
                ],
                # only the aligned alternative is constrained: the second one takes any 4
                "constraints": [{"requests": ["gpus/aligned"], "matchAttribute": NUMA_ATTRIBUTE}],
            },
        ),
        ("none", {"requests": [{"name": "gpus", "exactly": EXACT}]}),
    ],
)
def test_policy_to_claim(policy: str, want: dict[str, Any]) -> None:
    assert devices(policy) == want


def test_default_name_and_policy_annotation() -> None:
    template = claim_template(gpus=2, policy="single-pcie", device_class="c", namespace="ml")
    assert template["metadata"]["name"] == "gpus-2-single-pcie"
    assert template["metadata"]["annotations"] == {"gpuwarden.io/topology-policy": "single-pcie"}
    named = claim_template(gpus=2, policy="none", device_class="c", namespace="ml", name="mine")
    assert named["metadata"]["name"] == "mine"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"gpus": 0}, "--gpus must be at least 1, not 0"),
        (
            {"policy": "spread"},
            "--policy must be one of single-numa, prefer-numa, single-pcie, none, not 'spread'",
        ),
        ({"device_class": " "}, "--device-class must name the DeviceClass"),
    ],
)
def test_bad_requests_name_the_option(kw: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"gpus": 4, "policy": "single-numa", "device_class": "c", "namespace": "ml", **kw}
    with pytest.raises(TemplateError, match=message):
        claim_template(**args)


def test_pod_usage_refers_to_the_template() -> None:
    usage = pod_usage("gpus-4-single-numa")
    assert usage["spec"]["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "gpus-4-single-numa"}
    ]
    assert usage["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]


def test_cli_prints_the_template_and_refuses_bad_input() -> None:
    cmd = [sys.executable, "-m", "gpuwarden", "dra", "claim-template", "--gpus", "8", "--namespace", "ml"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert len(docs) == 1 and docs[0]["metadata"]["name"] == "gpus-8-single-numa"
    assert "resourceClaimTemplateName: gpus-8-single-numa" in out  # the usage comment
    bad = subprocess.run([*cmd, "--policy", "spread"], capture_output=True, text=True)
    assert bad.returncode == 1 and "--policy must be one of" in bad.stderr and not bad.stdout
