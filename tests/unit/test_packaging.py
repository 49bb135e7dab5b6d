"""The wheel holds the product and nothing else: the harness and the tests stay in the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_product_only(tmp_path: Path) -> None:
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "-w", str(tmp_path), str(ROOT)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("gpuwarden-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"gpuwarden", "adapter", "controller", "nodeagent"}, tops
    assert "nodeagent/kubeletapi/deviceplugin/v1beta1/api_pb2.py" in names
    assert "controller/gpus/model.py" in names and "gpuwarden/wellknown.py" in names
