"""The image holds the product and nothing else, and every command of it runs inside it.

Reads the OCI archive ``make image`` built (no container tool), flattens its layers with the whiteout
rules, checks the file list against tests/image/rules.py, then runs the image's entrypoint chrooted into the
unpacked root file system as the image's user (65532) with the image's environment: every ``gpuwarden``
sub-command's ``--help``, an import of every product module (``--help`` alone imports little: the
sub-commands import their deployable lazily, which is how a missing ``nodeagent/`` went unseen), and the
harness commands' "not installed" answer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpuwarden.cli import build_parser
from harness.testbed.product_image import ProductImage, run_in_rootfs
from tests.image.rules import FORBIDDEN, PRODUCT_PACKAGES, Rule, missing_product, offending

SITE = "opt/gpuwarden/lib/python3.11/site-packages"
SUBCOMMANDS = sorted(
    next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
)


def test_image_summary(image: ProductImage, image_files: dict[str, str]) -> None:
    """Printed numbers (not asserted): what `make image` produced."""
    info = json.loads((image.archive.parent / "image.json").read_text())
    print(
        f"\nimage {image.ref} {image.digest}: {info['unpacked_bytes'] / 2**20:.1f} MiB unpacked, "
        f"{info['layers_bytes'] / 2**20:.1f} MiB compressed, {len(image_files)} paths, "
        f"built in {info.get('build_seconds', 0):.0f}s"
    )
    assert image.ref, "the archive names no image reference"


@pytest.mark.parametrize("rule", FORBIDDEN, ids=lambda r: r.id)
def test_no_forbidden_path(rule: Rule, image_files: dict[str, str]) -> None:
    hits = [path for rule_id, path in offending(image_files) if rule_id == rule.id]
    assert hits == [], f"{rule.why}: {hits[:20]}"


def test_product_packages_present(image_files: dict[str, str]) -> None:
    assert missing_product(image_files, SITE) == []
    assert image_files.get("opt/gpuwarden/bin/gpuwarden") == "f"


def test_runs_unprivileged(image: ProductImage) -> None:
    assert image.user == "65532:65532"
    assert image.entrypoint == ["gpuwarden"]


@pytest.mark.parametrize("command", [[], *([c] for c in SUBCOMMANDS)], ids=lambda c: " ".join(c) or "top")
def test_help_runs_in_image(command: list[str], image: ProductImage, rootfs: Path) -> None:
    res = run_in_rootfs(rootfs, image, [*command, "--help"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("usage: gpuwarden"), res.stdout[:500]


def test_every_product_module_imports_in_image(image: ProductImage, rootfs: Path) -> None:
    script = (
        "import importlib, pkgutil, sys\n"
        f"roots = {list(PRODUCT_PACKAGES)!r}\n"
        "names = []\n"
        "for root in roots:\n"
        "    pkg = importlib.import_module(root)\n"
        "    names.append(root)\n"
        "    mods = pkgutil.walk_packages(pkg.__path__, root + '.')\n"
        "    names += [m.name for m in mods if not m.name.endswith('.__main__')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    res = run_in_rootfs(rootfs, image, ["python", "-c", script], entrypoint=False, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert int(res.stdout.strip()) > 50


def test_harness_commands_say_it_is_absent(image: ProductImage, rootfs: Path) -> None:
    res = run_in_rootfs(rootfs, image, ["simulate", "--scenario", "/nonexistent.yaml"])
    assert res.returncode != 0
    assert "harness is not installed" in res.stderr


def test_version_matches_the_checkout(image: ProductImage, rootfs: Path) -> None:
    from gpuwarden import __version__

    res = run_in_rootfs(rootfs, image, ["--version"])
    assert res.stdout.strip() == f"gpuwarden {__version__}"
    assert image.ref.endswith(f":{__version__}")
