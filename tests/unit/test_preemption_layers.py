"""Layering of the nomination and preemption packages, checked in a fresh interpreter (transitively): the
decision modules import no I/O module, and nothing here imports `adapter`. The same rules as the
import-linter contracts in .importlinter, for modules those contracts do not list yet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE = [
    "controller.preemption.signals",
    "controller.preemption.graph",
    "controller.preemption.reservations",
    "controller.preemption.throttle",
    "controller.nominations.snapshot",
    "controller.nominations.plan",
    "controller.nominations.decide",
]
SHELLS = ["controller.preemption.hook", "controller.nominations.loop"]
IO = (
    "aiohttp",
    "httpx",
    "kubernetes",
    "urllib3",
    "gpuwarden.kube",
    "gpuwarden.promclient",
    "prometheus_client",
)


def loaded_by(*modules: str) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("module", PURE)
def test_decision_modules_import_no_io(module: str) -> None:
    loaded = loaded_by(module)
    leaked = sorted(m for m in loaded if m.split(".")[0] in IO or m.startswith(IO))
    assert not leaked, f"{module} pulls in {leaked[:5]}"


def test_controller_never_imports_adapter() -> None:
    assert not any(m == "adapter" or m.startswith("adapter.") for m in loaded_by(*PURE, *SHELLS))
