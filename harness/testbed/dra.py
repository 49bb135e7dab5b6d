"""The test bed's DRA kubelet plugin (``gpu-dra-driver``, tests/testbed/dra-driver) on a real kubelet node.

No GPU DRA driver is available here, so a small Go driver of ours (built by ``make testbed``) plays one: it
registers with the node's kubelet through ``<root-dir>/plugins_registry``, publishes a ResourceSlice of
GPU-like devices for the node (attributes ``uuid``, ``index``, ``resource.kubernetes.io/pcieRoot``,
``resource.kubernetes.io/numaNode``) and answers NodePrepareResources / NodeUnprepareResources without CDI
devices (the node's containerd 1.6 has no CDI). It runs as a plain process with the node's own credentials
(``system:node:<name>``), so the Node authorizer decides what it may read and write, as for a driver's
DaemonSet on a kubeadm node.

The DeviceClass manifests ship beside the driver's source (``deviceclass.yaml``; ``deviceclass-extended.yaml``
adds ``extendedResourceName: nvidia.com/gpu``, served only where ``DRAExtendedResource`` is on: GA in 1.37,
alpha and off in 1.35, where the API server drops the field).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.testbed.binaries import repo_root
from harness.testbed.realnode import RealNode
from harness.testbed.waiting import poll

DRIVER_NAME = "gpu.gpuwarden.test"
DRIVER_BINARY = "gpu-dra-driver"
NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
REGISTERED_LINE = "registered with the kubelet"


class DraDriverError(RuntimeError):
    """The DRA kubelet plugin did not start or register (the message carries its log tail)."""


def manifest_dir() -> Path:
    return repo_root() / "tests" / "testbed" / "dra-driver"


def device_class(*, extended_resource: bool = False) -> dict[str, Any]:
    """The shipped DeviceClass (selects the driver's devices); ``extended_resource`` adds the
    ``extendedResourceName: nvidia.com/gpu`` mapping (KEP-5004)."""
    name = "deviceclass-extended.yaml" if extended_resource else "deviceclass.yaml"
    doc: dict[str, Any] = yaml.safe_load((manifest_dir() / name).read_text())
    return doc


def claim_template(
    name: str,
    *,
    device_class_name: str,
    count: int,
    match_attribute: str | None = None,
    request: str = "gpus",
) -> dict[str, Any]:
    """A ResourceClaimTemplate asking for ``count`` devices of the class, all sharing one value of
    ``match_attribute`` when given (``resource.kubernetes.io/numaNode`` = one NUMA node)."""
    devices: dict[str, Any] = {
        "requests": [{"name": request, "exactly": {"deviceClassName": device_class_name, "count": count}}]
    }
    if match_attribute:
        devices["constraints"] = [{"requests": [request], "matchAttribute": match_attribute}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def allocated_devices(claim: Mapping[str, Any], driver: str = DRIVER_NAME) -> list[str]:
    """Device names ``status.allocation`` gives the claim from ``driver`` (sorted)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return sorted(str(r["device"]) for r in results if r.get("driver") == driver)


def slice_attributes(slices: Mapping[str, Any], driver: str = DRIVER_NAME) -> dict[str, dict[str, Any]]:
    """Device name → {attribute: value} over a ResourceSliceList, for one driver (values unwrapped from
    ``{"int": 0}`` / ``{"string": "x"}``)."""
    out: dict[str, dict[str, Any]] = {}
    for item in slices.get("items") or []:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        for device in spec.get("devices") or []:
            attrs = {
                key: next(iter(value.values())) if isinstance(value, dict) and value else value
                for key, value in (device.get("attributes") or {}).items()
            }
            out[str(device["name"])] = attrs
    return out


@dataclass(frozen=True)
class DraDriverSpec:
    driver_name: str = DRIVER_NAME
    devices: int = 8
    numa_nodes: int = 2
    pcie_roots_per_numa: int = 2
    verbosity: int = 2
    register_timeout: float = 60.0


class DraDriver:
    """``gpu-dra-driver`` running beside ``node``'s kubelet. :meth:`start`, then always :meth:`stop` (or
    ``with``) before the node stops: its sockets and state live in the node's kubelet root."""

    def __init__(self, node: RealNode, binary: Path, spec: DraDriverSpec | None = None) -> None:
        self.node = node
        self.binary = binary
        self.spec = spec or DraDriverSpec()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def registry_dir(self) -> Path:
        """The kubelet's plugin watcher directory (follows ``--root-dir``)."""
        return self.node.kubelet_root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.node.kubelet_root / "plugins" / self.spec.driver_name

    @property
    def state_file(self) -> Path:
        return self.plugin_dir / "prepared.json"

    @property
    def log_path(self) -> Path:
        return self.node.log(DRIVER_BINARY)

    def command(self) -> list[str]:
        s = self.spec
        return [
            str(self.binary),
            f"--driver-name={s.driver_name}",
            f"--node-name={self.node.name}",
            f"--kubeconfig={self.node.kubeconfig}",
            f"--devices={s.devices}",
            f"--numa-nodes={s.numa_nodes}",
            f"--pcie-roots-per-numa={s.pcie_roots_per_numa}",
            f"--registrar-dir={self.registry_dir}",
            f"--plugin-dir={self.plugin_dir}",
            f"--state-file={self.state_file}",
            f"--v={s.verbosity}",
        ]

    def start(self) -> DraDriver:
        if not self.binary.is_file():
            raise DraDriverError(
                f"{self.binary} missing: build it with `make testbed` "
                "(tests/testbed/build.sh, step dra-driver)"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = self._proc

        def registered() -> bool:
            text = self.log_path.read_text(errors="replace")
            if "kubelet rejected the registration" in text or proc.poll() is not None:
                raise DraDriverError(f"{DRIVER_BINARY} failed (rc={proc.poll()}):\n{self.log_tail()}")
            return REGISTERED_LINE in text

        try:
            poll(
                registered,
                timeout=self.spec.register_timeout,
                interval=0.2,
                what=f"{DRIVER_BINARY} registered with kubelet {self.node.name}",
            )
        except TimeoutError as exc:
            self.stop()
            raise DraDriverError(f"{exc}\n--- {DRIVER_BINARY} log tail:\n{self.log_tail()}") from exc
        return self

    def prepared(self) -> dict[str, dict[str, Any]]:
        """Claims the driver has prepared now (UID → namespace, name, devices), from its checkpoint."""
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): dict(v) for k, v in (raw.get("claims") or {}).items()}

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return f"(no log at {self.log_path})"

    def stop(self, grace: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> DraDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
