"""Every kustomize directory says which APIServices it claims, and the rendered objects agree.

An APIService has one owner per cluster: applying a directory that registers one re-points that API from
prometheus-adapter, KEDA or metrics-server to gpuwarden. The first line a user reads (the kustomization's
`# claims APIServices:` comment, and docs/install.md's table) must be the truth.
"""

from __future__ import annotations

import re

import pytest

from tests.unit.test_deploy_render import DEPLOY, OVERLAYS, render

CLAIMS = re.compile(r"^# claims APIServices: (?P<names>none|[a-z0-9., ]+?)(?: \(.*\))?$", re.MULTILINE)
DIRECTORIES = [d for d in OVERLAYS if d != "examples"]


def claimed(directory: str) -> set[str]:
    text = (DEPLOY / directory / "kustomization.yaml").read_text()
    found = CLAIMS.search(text)
    assert found, f"{directory}/kustomization.yaml has no '# claims APIServices:' line"
    names = found.group("names")
    return set() if names == "none" else {n.strip() for n in names.split(",")}


@pytest.mark.parametrize("directory", DIRECTORIES)
def test_the_claims_line_names_exactly_the_rendered_apiservices(directory: str) -> None:
    rendered = {o["metadata"]["name"] for o in render(DEPLOY / directory) if o["kind"] == "APIService"}
    assert claimed(directory) == rendered


@pytest.mark.parametrize("directory", DIRECTORIES)
def test_docs_install_table_names_the_same_claims(directory: str) -> None:
    docs = (DEPLOY.parent / "docs" / "install.md").read_text()
    row = next((line for line in docs.splitlines() if line.startswith(f"| `deploy/{directory}` |")), None)
    assert row is not None, f"docs/install.md has no table row for deploy/{directory}"
    cells = [c.strip() for c in row.strip("|").split("|")]
    names = cells[2].replace("`", "")
    assert (set() if names == "none" else {n.strip() for n in names.split(",")}) == claimed(directory)


def test_the_dry_run_overlay_takes_no_metrics_api() -> None:
    assert claimed("overlays/dry-run") == set()
    assert "v1beta1.external.metrics.k8s.io" not in claimed("overlays/keda")
