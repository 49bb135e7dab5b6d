"""Finding the test bed binaries built by ``tests/testbed/build.sh``.

The e2e tier and the demo run real upstream components (kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, kubelet, kube-proxy, etcd, kwok, kwokctl) and the test bed's DRA kubelet plugin
(gpu-dra-driver) that ``make testbed`` compiles into
``.cache/testbed/<versions-key>/bin`` and points ``.cache/testbed/current`` at. This module resolves that
directory once, checks that every binary is there, and fails with an actionable message when it is not, so a
missing build is an error and never a silently skipped test.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED_BINARIES: tuple[str, ...] = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "etcd",
    "kwok",
    "kwokctl",
    "gpu-dra-driver",  # the DRA kubelet plugin of the real node (tests/testbed/dra-driver)
)
ENV_BIN_DIR = "GPUWARDEN_TESTBED_BIN"


class TestbedMissingError(RuntimeError):
    """The test bed binaries have not been built (or are incomplete)."""

    __test__ = False  # not a pytest test class despite the name


def repo_root() -> Path:
    """The source checkout this package lives in (the package is installed editable)."""
    return Path(__file__).resolve().parents[2]


def default_bin_dir() -> Path:
    """``$GPUWARDEN_TESTBED_BIN`` if set, else ``<repo>/.cache/testbed/current/bin``."""
    env = os.environ.get(ENV_BIN_DIR)
    if env:
        return Path(env)
    return repo_root() / ".cache" / "testbed" / "current" / "bin"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the built binaries plus the versions recorded by build.sh."""

    bin_dir: Path
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def locate(cls, bin_dir: Path | None = None) -> Binaries:
        """Resolve and validate the binary directory; raise :class:`TestbedMissingError` if incomplete."""
        directory = (bin_dir or default_bin_dir()).resolve()
        missing = [name for name in REQUIRED_BINARIES if not os.access(directory / name, os.X_OK)]
        if missing:
            raise TestbedMissingError(
                f"test bed binaries missing in {directory}: {', '.join(missing)}. "
                "Build them with `make testbed` (bash tests/testbed/build.sh; ~11 min cold on 2 cores), "
                f"or point ${ENV_BIN_DIR} at a directory holding {', '.join(REQUIRED_BINARIES)}."
            )
        versions: dict[str, str] = {}
        manifest = directory.parent / "versions.json"
        if manifest.is_file():
            raw = json.loads(manifest.read_text())
            versions = {str(k): str(v) for k, v in raw.items()}
        return cls(bin_dir=directory, versions=versions)

    def path(self, name: str) -> Path:
        """Absolute path of one binary, e.g. ``path("kubectl")``."""
        return self.bin_dir / name

    @property
    def kube_version(self) -> str:
        """The Kubernetes version the binaries were built from (e.g. ``v1.35.4``)."""
        return self.versions.get("kubernetes", "")

    @property
    def etcd_version(self) -> str:
        """The etcd version without the leading ``v`` (kwokctl's format)."""
        return self.versions.get("etcd", "").lstrip("v")
