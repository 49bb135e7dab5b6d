"""No Service of ours turns into environment variables our own config loader rejects.

With ``enableServiceLinks`` left at its default, the kubelet gives every container ``<SERVICE>_SERVICE_HOST``,
``<SERVICE>_PORT_443_TCP_ADDR`` ... for every Service of its namespace. Services named ``gpuwarden-adapter``
and ``gpuwarden-controller`` become ``GPUWARDEN_ADAPTER_*`` and ``GPUWARDEN_CONTROLLER_*``: prefixed like a
config override, misspelt like one (a single ``_``), so the loader refuses to start - every pod of the chart
crash-looped the first time it ran as a pod (tests/e2e/test_installed_image.py). The manifests turn the links
off; this test derives the variables the kubelet would inject from the rendered Services and feeds them to the
loader for every pod of ours that would still get them.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.config.loader import env_overrides
from tests.unit.test_deploy_render import OVERLAYS, _pod_specs, rendered

Obj = dict[str, Any]


def link_variables(service: Obj) -> dict[str, str]:
    """The Docker-link variables the kubelet makes for one ClusterIP Service (pkg/kubelet/envvars)."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    ip = "10.96.0.10"
    env = {f"{name}_SERVICE_HOST": ip}
    for i, port in enumerate(service["spec"].get("ports") or []):
        number, proto = port["port"], port.get("protocol", "TCP")
        if i == 0:
            env[f"{name}_SERVICE_PORT"] = str(number)
            env[f"{name}_PORT"] = f"{proto.lower()}://{ip}:{number}"
        if port.get("name"):
            env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
        prefix = f"{name}_PORT_{number}_{proto}"
        env.update({prefix: f"{proto.lower()}://{ip}:{number}", f"{prefix}_PROTO": proto.lower()})
        env.update({f"{prefix}_PORT": str(number), f"{prefix}_ADDR": ip})
    return env


def test_link_variables_of_our_adapter_service_are_rejected_by_the_loader() -> None:
    """The premise: without the manifests' setting the loader refuses these variables."""
    service = {"metadata": {"name": "gpuwarden-adapter"}, "spec": {"ports": [{"name": "https", "port": 443}]}}
    _, problems = env_overrides(link_variables(service))
    assert any("GPUWARDEN_ADAPTER_SERVICE_HOST" in where for where, _ in problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_of_ours_gets_service_links_the_loader_rejects(overlay: str) -> None:
    objects = rendered(overlay)
    for obj in objects:
        for spec in _pod_specs(obj):
            runs_gpuwarden = any("gpuwarden/gpuwarden" in c["image"] for c in spec["containers"])
            if not runs_gpuwarden or spec.get("enableServiceLinks") is False:
                continue
            ns = obj["metadata"].get("namespace", "")
            env: dict[str, str] = {}
            for svc in objects:
                if svc["kind"] == "Service" and svc["metadata"].get("namespace", "") == ns:
                    env.update(link_variables(svc))
            _, problems = env_overrides(env)
            assert problems == [], f"{obj['kind']}/{obj['metadata']['name']} would get {problems[:3]}"
