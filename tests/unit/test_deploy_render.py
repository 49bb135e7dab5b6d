"""A small kustomize renderer for deploy/, so the manifests are checked structurally without kubectl.

deploy/ uses only a subset of kustomize on purpose: `resources` (files and directories), `labels` (pairs,
metadata only), `images` (newTag / newName) and inline JSON 6902 `patches` with a target (plus the one
strategic-merge patch an overlay needs to drop a base object: `$patch: delete`). `render()`
implements exactly that and rejects anything else, so a new feature cannot be silently mis-rendered; when the
testbed's kubectl is built, the result is compared with real `kubectl kustomize` output (the e2e tier
compares again, where the binary is guaranteed).
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = (
    "base",
    "overlays/dry-run",
    "overlays/monitoring",
    "overlays/scheduler",
    "examples",
    "overlays/node-agent",
    "overlays/resource-metrics",
    "overlays/keda",
    "overlays/claim-bind",
    "overlays/extender-mtls",
)
SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "labels", "images", "patches"}
Obj = dict[str, Any]


def identity(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _pod_specs(obj: Obj) -> list[Obj]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Pod":
        return [spec]
    template = spec.get("template", {}).get("spec")
    return [template] if template else []


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def _json6902(obj: Obj, ops: list[Obj]) -> None:
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        kind = op["op"]
        if kind == "add" and isinstance(node, list):
            if last == "-":
                node.append(copy.deepcopy(op["value"]))
            else:
                node.insert(int(last), copy.deepcopy(op["value"]))
        elif kind in ("add", "replace"):
            if isinstance(node, list):
                node[int(last)] = copy.deepcopy(op["value"])
            else:
                node[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise AssertionError(f"unsupported JSON patch op {kind!r}")


def _matches(obj: Obj, target: Obj) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    want = {
        "group": group,
        "version": version,
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace", ""),
    }
    return all(want[k] == v for k, v in target.items())


def render(directory: Path) -> list[Obj]:
    """The objects `kubectl kustomize directory` would print (any order)."""
    kfile = directory / "kustomization.yaml"
    spec = yaml.safe_load(kfile.read_text())
    unknown = set(spec) - SUPPORTED_KEYS
    assert not unknown, f"{kfile}: kustomize features the test renderer does not implement: {unknown}"
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in spec.get("patches", []):
        assert set(patch) == {"target", "patch"}, f"{kfile}: only inline JSON 6902 patches with a target"
        hits = [o for o in objects if _matches(o, patch["target"])]
        assert hits, f"{kfile}: patch target {patch['target']} matches nothing"
        body = yaml.safe_load(patch["patch"])
        if isinstance(body, dict):
            assert body.get("$patch") == "delete", f"{kfile}: a strategic-merge patch may only delete"
            assert _matches(body, patch["target"]), f"{kfile}: the delete patch names another object"
            objects = [o for o in objects if not any(o is hit for hit in hits)]
            continue
        for obj in hits:
            _json6902(obj, body)
    for group in spec.get("labels", []):
        assert not group.get("includeSelectors") and not group.get("includeTemplates")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(group["pairs"])
    for image in spec.get("images", []):
        for obj in objects:
            for pod in _pod_specs(obj):
                for container in pod.get("containers", []) + pod.get("initContainers", []):
                    name, _, _tag = container["image"].partition(":")
                    if name == image["name"]:
                        container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return objects


def rendered(overlay: str) -> list[Obj]:
    return render(DEPLOY / overlay)


def kubectl() -> Path | None:
    found = sorted((ROOT / ".cache" / "testbed").glob("*/bin/kubectl"))
    return found[0] if found else None


def kubectl_kustomize(binary: Path, overlay: str) -> list[Obj]:
    out = subprocess.run(
        [str(binary), "kustomize", str(DEPLOY / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_identity(objects: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    out = {identity(o): o for o in objects}
    assert len(out) == len(objects), "duplicate objects"
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_with_unique_objects(overlay: str) -> None:
    objects = rendered(overlay)
    assert objects
    by_identity(objects)


# The renderer is compared with the real `kubectl kustomize` in tests/e2e/test_deploy_dryrun.py, where the
# testbed's kubectl is always built; the unit tier never skips for a missing binary.


def test_json6902_append_and_replace() -> None:
    obj: Obj = {"a": {"list": [1, 2]}, "b": 1}
    _json6902(
        obj, [{"op": "add", "path": "/a/list/-", "value": 3}, {"op": "replace", "path": "/b", "value": 2}]
    )
    assert obj == {"a": {"list": [1, 2, 3]}, "b": 2}
