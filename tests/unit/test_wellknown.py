"""One home for every `gpuwarden.io/*` name: no product module spells a key itself, and the GPU-set value
format is read and written one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuwarden import wellknown

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("gpuwarden", "adapter", "controller", "nodeagent")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
    return ids


def _spelled_keys(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and node.value.startswith(f"{wellknown.DOMAIN}/")
    ]


def test_no_product_module_spells_a_gpuwarden_io_key() -> None:
    found = [
        hit
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "gpuwarden" / "wellknown.py" and "kubeletapi" not in path.parts
        for hit in _spelled_keys(path)
    ]
    assert found == [], "define these in gpuwarden/wellknown.py:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        (None, None),
        ("", None),
        (" , ", None),
        ("0,1,2,3", ("0", "1", "2", "3")),
        ("3, 1,1", ("1", "3")),
        ("10,2", ("2", "10")),
        ("GPU-b,1,GPU-a", ("1", "GPU-a", "GPU-b")),
    ],
    ids=["absent", "empty", "blank", "plain", "unordered-duplicates", "numeric-order", "mixed"],
)
def test_gpu_ids_read_one_way(text: str | None, ids: tuple[str, ...] | None) -> None:
    assert wellknown.parse_gpu_ids(text) == ids
    if ids is not None:
        assert wellknown.parse_gpu_ids(wellknown.format_gpu_ids(ids)) == ids
