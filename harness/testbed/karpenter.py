"""Karpenter's kwok cloud provider against the test bed: the real autoscaler, launching kwok GPU nodes.

Karpenter (sigs.k8s.io/karpenter) ships a kwok cloud provider that "launches" an instance by writing a Node
object itself; the test bed's kwok (managing every node) then makes it Ready and runs its pods. That makes the
real provisioner and disruption controllers runnable here. ``make karpenter`` (tests/karpenter/build.sh)
builds the binary as ``karpenter-kwok`` and copies Karpenter's CRDs from the module into
``.cache/karpenter/current``.

`Karpenter` applies the CRDs and one KWOKNodeClass, writes an instance-types file (8-GPU types carrying
``nvidia.com/gpu``), starts the binary out of cluster (``KUBECONFIG``, no leader election, its metrics and
health ports moved off 8080/8081) and, on `stop`, deletes the NodePools and NodeClaims it served while it
still runs (so its termination finalizers are handled), then stops it. `gpu_node_pool` builds a NodePool of
8-GPU nodes that carry the labels GPU feature discovery writes and gpuwarden's topology annotation, the way
the fleet's own nodes look (harness.testbed.nodes).

Facts relied on (Karpenter v1.15 sources; reference autoscalers-and-domains.md section A): the Node gets
the NodeClaim's labels and annotations (NodePool ``template.metadata``); its ``status.allocatable`` is the
instance type's; pods are provisionable only with ``PodScheduled`` reason ``Unschedulable`` and no
``nominatedNodeName``; existing nodes (managed or not) are simulated first.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden import ports
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from harness.testbed.binaries import TestbedMissingError, repo_root
from harness.testbed.cluster import Cluster
from harness.testbed.nodes import GPU_RESOURCE, GpuNodeSpec
from harness.testbed.waiting import poll

ENV_DIR = "GPUWARDEN_KARPENTER_DIR"
NODECLASS = "gpuwarden-e2e"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE = "gpu-8x-h100"
ZONE = "test-zone-a"


def default_dir() -> Path:
    """``$GPUWARDEN_KARPENTER_DIR`` if set, else ``<repo>/.cache/karpenter/current``."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else repo_root() / ".cache" / "karpenter" / "current"


@dataclass(frozen=True)
class KarpenterBuild:
    """The binary and the CRD files `make karpenter` left."""

    binary: Path
    crds: tuple[Path, ...]

    @classmethod
    def locate(cls, directory: Path | None = None) -> KarpenterBuild:
        root = (directory or default_dir()).resolve()
        binary = root / "bin" / "karpenter-kwok"
        crds = tuple(sorted((root / "crds").glob("*.yaml")))
        if not os.access(binary, os.X_OK) or not crds:
            raise TestbedMissingError(
                f"Karpenter (kwok provider) missing in {root}: build it with `make karpenter` "
                f"(bash tests/karpenter/build.sh), or point ${ENV_DIR} at a directory with "
                "bin/karpenter-kwok and crds/*.yaml."
            )
        return cls(binary=binary, crds=crds)


def gpu_instance_types(
    gpus: int = 8, cpu: str = "64", memory: str = "512Gi", price: float = 32.0
) -> list[dict[str, Any]]:
    """The instance-types file: one on-demand `gpus`-GPU type in one zone (the kwok provider's JSON shape,
    `kwok/cloudprovider/instance_types.json`; `resources` is a ResourceList: `nvidia.com/gpu` is offered)."""
    return [
        {
            "name": INSTANCE_TYPE,
            "offerings": [
                {
                    "Price": price,
                    "Available": True,
                    "Requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                    ],
                }
            ],
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {
                "cpu": cpu,
                "memory": memory,
                "pods": "110",
                "ephemeral-storage": "1Ti",
                GPU_RESOURCE: str(gpus),
            },
        }
    ]


def gpu_node_pool(
    name: str,
    *,
    labels: Mapping[str, str],
    topology: Mapping[str, Any] | None,
    taints: Sequence[Mapping[str, str]] = (),
    max_gpus: int = 64,
    consolidation: str = "WhenEmptyOrUnderutilized",
    consolidate_after: str = "Never",
) -> dict[str, Any]:
    """A NodePool of 8-GPU nodes (the instance type above) that look like the fleet's: GPU feature
    discovery's labels (`GpuNodeSpec.gfd_labels`), `labels`, and the node agent's topology annotation
    (`topology`, as JSON) - all through ``template.metadata``, which Karpenter copies to the Node."""
    template_meta: dict[str, Any] = {"labels": {**GpuNodeSpec(name="template").gfd_labels(), **labels}}
    if topology is not None:
        template_meta["annotations"] = {TOPOLOGY_ANNOTATION: json.dumps(topology, separators=(",", ":"))}
    spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODECLASS},
        "expireAfter": "Never",
        "requirements": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [INSTANCE_TYPE]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ],
    }
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {"metadata": template_meta, "spec": spec},
            "limits": {GPU_RESOURCE: str(max_gpus)},
            "disruption": {
                "consolidationPolicy": consolidation,
                "consolidateAfter": consolidate_after,
                "budgets": [{"nodes": "100%"}],
            },
        },
    }


@dataclass
class Karpenter:
    """One Karpenter (kwok provider) process for the cluster; `start` / `stop`, or use as a context."""

    cluster: Cluster
    workdir: Path
    build: KarpenterBuild = field(default_factory=KarpenterBuild.locate)
    instance_types: list[dict[str, Any]] = field(default_factory=gpu_instance_types)
    batch_idle_seconds: float = 1.0
    registration_delay: str = "0s"
    """The KWOKNodeClass's `nodeRegistrationDelay`: how long a launched node takes to appear (a cloud
    instance boots for a minute or more; kwok's is instant unless told)."""
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = 0
    metrics_port: int = 0
    _pools: list[str] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.workdir / "karpenter.log"

    def install(self) -> None:
        """The CRDs (server-side: the NodePool CRD is too large for a client-side apply annotation), and
        the KWOKNodeClass the pools name."""
        for crd in self.build.crds:
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd), timeout=120)
        names = [
            "nodepools.karpenter.sh",
            "nodeclaims.karpenter.sh",
            "nodeoverlays.karpenter.sh",
            "kwoknodeclasses.karpenter.kwok.sh",
        ]
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names)
        )
        self.cluster.apply(
            {
                "apiVersion": "karpenter.kwok.sh/v1alpha1",
                "kind": "KWOKNodeClass",
                "metadata": {"name": NODECLASS},
                "spec": {"nodeRegistrationDelay": self.registration_delay},
            }
        )

    def start(self) -> Karpenter:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.install()
        types = self.workdir / "instance-types.json"
        types.write_text(json.dumps(self.instance_types))
        self.health_port, self.metrics_port = ports.free_port("127.0.0.1"), ports.free_port("127.0.0.1")
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "DISABLE_LEADER_ELECTION": "true",
            "HEALTH_PROBE_PORT": str(self.health_port),
            "METRICS_PORT": str(self.metrics_port),
            "INSTANCE_TYPES_FILE_PATH": str(types),
            "BATCH_IDLE_DURATION": f"{self.batch_idle_seconds}s",
            "LOG_LEVEL": "debug",
            "SYSTEM_NAMESPACE": "kube-system",
        }
        out = self.log.open("ab")
        self.proc = subprocess.Popen([str(self.build.binary)], env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        try:
            poll(self._ready, timeout=90, interval=0.5, what="Karpenter ready (readyz)")
        except Exception:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"Karpenter exited ({self.proc.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def lines(self, needle: str) -> list[str]:
        """Log lines containing `needle`."""
        try:
            return [line for line in self.log.read_text(errors="replace").splitlines() if needle in line]
        except OSError:
            return []

    def add_pool(self, pool: Mapping[str, Any]) -> str:
        self.cluster.apply(pool)
        name = str(pool["metadata"]["name"])
        self._pools.append(name)
        return name

    def nodeclaims(self, pool: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.get_json(
            "nodeclaims.karpenter.sh", "-l", f"{NODEPOOL_LABEL}={pool}"
        )["items"]
        return items

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.get_json("nodes", "-l", f"{NODEPOOL_LABEL}={pool}")[
            "items"
        ]
        return items

    def delete_pool(self, pool: str, timeout: float = 90) -> None:
        """The pool, its NodeClaims and their Nodes, while Karpenter runs to finalize them; what is left after
        `timeout` loses its finalizers (a test bed must not keep nodes a later test could land on)."""
        self.cluster.kubectl(
            "delete", "nodepool.karpenter.sh", pool, "--ignore-not-found", "--wait=false", check=False
        )
        self.cluster.kubectl(
            "delete", "nodeclaims.karpenter.sh", "-l", f"{NODEPOOL_LABEL}={pool}", "--wait=false", check=False
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.nodeclaims(pool) or self.nodes(pool)):
            time.sleep(1)
        for kind, items in (("nodeclaims.karpenter.sh", self.nodeclaims(pool)), ("node", self.nodes(pool))):
            for item in items:
                name = item["metadata"]["name"]
                self.cluster.kubectl(
                    "patch", kind, name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
                )
                self.cluster.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)
        if pool in self._pools:
            self._pools.remove(pool)

    def stop(self) -> None:
        for pool in list(self._pools):
            self.delete_pool(pool)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> Karpenter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
