"""deploy/sbom.py: every package the image installs is in the SBOM, with its version and wheel hash."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def sbom_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sbom", ROOT / "deploy" / "sbom.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_locked_package_is_a_component_with_its_hash() -> None:
    text = (ROOT / "deploy" / "image" / "requirements.txt").read_text()
    locked = {
        (m[1].lower(), m[2], m[3])
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) --hash=sha256:(\w+)", text, re.M)
    }
    doc = sbom_module().sbom("0.1.0", text)
    found = {
        (c["name"], c["version"], c["hashes"][0]["content"])
        for c in doc["components"]
        if c["type"] == "library"
    }
    assert locked and found == locked
    assert doc["bomFormat"] == "CycloneDX" and doc["metadata"]["component"]["version"] == "0.1.0"


def test_the_release_versions_agree() -> None:
    pyproject = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    chart = (ROOT / "deploy" / "helm" / "gpuwarden" / "Chart.yaml").read_text()
    assert pyproject is not None
    assert f"version: {pyproject[1]}" in chart and f'appVersion: "{pyproject[1]}"' in chart
