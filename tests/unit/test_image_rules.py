"""The image content rules (tests/image/rules.py) flag what must not ship and pass what must."""

from __future__ import annotations

import pytest

from tests.image.rules import missing_product, offending

SITE = "opt/gpuwarden/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        pytest.param(f"{SITE}/harness/testbed/cluster.py", "harness", id="harness-package"),
        pytest.param(f"{SITE}/harness", "harness", id="harness-dir"),
        pytest.param(f"{SITE}/tests/e2e/test_helm_chart.py", "tests", id="tests-package"),
        pytest.param(f"{SITE}/gpuwarden/simulator/serve.py", "product-demo-or-simulator", id="simulator"),
        pytest.param(f"{SITE}/gpuwarden/demo.py", "product-demo-or-simulator", id="demo-module"),
        pytest.param(f"{SITE}/pip/__init__.py", "pip", id="pip-package"),
        pytest.param("usr/lib/python3/dist-packages/pip/__init__.py", "pip", id="debian-pip"),
        pytest.param("opt/gpuwarden/bin/pip3.11", "pip", id="pip-script"),
        pytest.param(f"{SITE}/pip-25.3.dist-info/RECORD", "pip", id="pip-metadata"),
        pytest.param(f"{SITE}/setuptools/__init__.py", "setuptools", id="setuptools"),
        pytest.param(f"{SITE}/pkg_resources/__init__.py", "setuptools", id="pkg-resources"),
        pytest.param(f"{SITE}/_distutils_hack/__init__.py", "setuptools", id="distutils-hack"),
        pytest.param(f"{SITE}/wheel/__init__.py", "wheel", id="wheel"),
        pytest.param(
            "usr/share/python-wheels/pip-23.0.1-py3-none-any.whl", "bundled-wheels", id="debian-wheels"
        ),
        pytest.param("wheels/aiohttp-3.14.5-cp311.whl", "bundled-wheels", id="wheelhouse"),
        pytest.param("usr/bin/gcc-12", "compiler", id="gcc-versioned"),
        pytest.param("usr/bin/cc", "compiler", id="cc"),
        pytest.param("usr/bin/x86_64-linux-gnu-gcc-12", "compiler", id="triplet-gcc"),
        pytest.param("usr/lib/gcc/x86_64-linux-gnu/12/cc1", "compiler", id="cc1"),
        pytest.param("usr/bin/ld", "compiler", id="linker"),
        pytest.param("src/pyproject.toml", "build-tree", id="build-sources"),
        pytest.param("opt/buildtools/bin/python", "build-tree", id="build-venv"),
    ],
)
def test_forbidden_path_is_flagged(path: str, rule: str) -> None:
    assert (rule, path) in offending([path])


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(f"{SITE}/gpuwarden/cli.py", id="product"),
        pytest.param(f"{SITE}/nodeagent/kubeletapi/deviceplugin/v1beta1/api_pb2.py", id="node-agent-stubs"),
        pytest.param(f"{SITE}/controller/extender/server.py", id="extender"),
        pytest.param(f"{SITE}/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so", id="grpc"),
        pytest.param(f"{SITE}/kubernetes/client/api/core_v1_api.py", id="kubernetes-client"),
        pytest.param("usr/bin/python3.11", id="python"),
        pytest.param("usr/lib/x86_64-linux-gnu/libgcc_s.so.1", id="libgcc-runtime"),
        pytest.param("usr/bin/ldd", id="ldd"),
        pytest.param("usr/lib/python3.11/unittest/__init__.py", id="stdlib-unittest"),
        pytest.param("opt/gpuwarden/bin/gpuwarden", id="entrypoint"),
    ],
)
def test_product_path_passes(path: str) -> None:
    assert offending([path]) == []


def test_missing_product_packages_are_named() -> None:
    paths = [f"{SITE}/{p}/__init__.py" for p in ("gpuwarden", "adapter", "controller")]
    assert missing_product(paths, SITE) == ["nodeagent"]
    assert missing_product([*paths, f"{SITE}/nodeagent/__init__.py"], SITE) == []
