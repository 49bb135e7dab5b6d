"""Lifecycle of a local Kubernetes control plane made of real upstream binaries and kwok nodes.

gpuwarden's e2e tests and demo need the real HPA controller, kube-scheduler, aggregation layer and API server,
but this machine has no container runtime. kwokctl's ``binary`` runtime runs etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and the kwok controller as host processes; kwok then plays kubelet for
fake nodes. This module drives kwokctl with the binaries from ``make testbed`` and adds what the test bed
needs on top of kwokctl v0.8.0:

* every listener on 127.0.0.1, a private ``KWOK_WORKDIR``, ``~/.kube/config`` never touched;
* the aggregation layer: a separate front-proxy CA and client cert plus the ``--requestheader-*`` flags that
  kwokctl <= v0.8.0 does not pass (kwok issue #1679), so APIServices backed by an ExternalName Service ->
  127.0.0.1 reach local processes and those see the front-proxy identity headers;
* a short, configurable HPA sync period, our KubeSchedulerConfiguration (extenders) and a way to restart
  kube-scheduler with a new one;
* teardown that deletes APIServices first (so namespace deletion and discovery never hang on a dead
  backend) and then stops every process by pid, whatever kwokctl managed to clean up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwarden import ports
from harness.testbed.binaries import Binaries
from harness.testbed.pki import (
    FRONT_PROXY_CLIENT_CN,
    FrontProxyPki,
    load_keypair,
    make_ca,
    write_front_proxy_pki,
)
from harness.testbed.realnode import (
    KubeletClientPki,
    RealNode,
    RealNodeError,
    RealNodeSpec,
    node_ip,
    write_kubelet_client_pki,
)
from harness.testbed.scheduler import scheduler_configuration
from harness.testbed.waiting import Progress, poll

LOCALHOST = "127.0.0.1"
_PORT_OPTIONS = (
    "kubeApiserverPort",
    "etcdPort",
    "etcdPeerPort",
    "kubeControllerManagerPort",
    "kubeSchedulerPort",
    "kwokControllerPort",
)
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_SANS = (
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
"""The ``kubernetes`` Service's ClusterIP (the first of SERVICE_CIDR) and names, as pods dial it."""
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


class ClusterError(RuntimeError):
    """The test bed cluster could not be created, reached or changed."""


@dataclass(frozen=True)
class ClusterConfig:
    """How to build the cluster. Durations are Go duration strings (``"2s"``)."""

    name: str = "gpuwarden"
    workdir: Path | None = None
    """KWOK_WORKDIR; a fresh temporary directory (removed on delete) when None."""
    scheduler_config: Mapping[str, Any] | None = None
    """A KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1); default: no extenders."""
    hpa_sync_period: str = "2s"
    hpa_downscale_stabilization: str = "5s"
    hpa_initial_readiness_delay: str = "1s"
    hpa_tolerance: float = 0.1
    kcm_controllers: str = "*"
    """``--controllers``; ``*`` includes the HPA, deployment and replicaset controllers."""
    extra_apiserver_args: Mapping[str, str] = field(default_factory=dict)
    extra_kcm_args: Mapping[str, str] = field(default_factory=dict)
    ready_timeout: float = 180.0
    progress: bool = True
    kwokctl_options: Mapping[str, Any] = field(default_factory=dict)
    """Merged last into ``KwokctlConfiguration.options`` (e.g. ``nodeLeaseDurationSeconds``,
    ``kubeControllerManagerNodeMonitorGracePeriodMilliseconds``); empty keeps kwokctl's defaults."""
    real_nodes: Sequence[RealNodeSpec] = ()
    """Real kubelet nodes (containerd + runc) to start beside the kwok nodes; at most one per machine.
    With any, kwok manages only nodes annotated ``kwok.x-k8s.io/node=fake`` (every :class:`GpuNodeSpec`
    node is) and kube-apiserver runs NodeRestriction admission and presents a kubelet-client certificate."""
    pod_network: bool = False
    """Pods on the real node reach Services, the ``kubernetes`` one included: kube-proxy runs on the real
    node, and kube-apiserver listens on every address, advertises the node IP (the ``kubernetes`` Service's
    endpoint, kept by the lease endpoint reconciler) and serves a certificate valid for the Service's
    ClusterIP and names. Needs ``real_nodes``. Off: everything stays on 127.0.0.1."""
    kwok_options: Mapping[str, Any] = field(default_factory=dict)
    """When given, a ``KwokConfiguration`` document with these ``options`` (e.g. ``nodeLeaseParallelism``,
    ``nodePlayStageParallelism``) is added for the kwok controller; empty keeps kwok's defaults."""


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (zombies of reparented kwokctl children count as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def process_memory(pid: int, field: str = "VmRSS") -> int:
    """A `/proc/PID/status` memory field (VmRSS, VmHWM, RssAnon, ...) in bytes; 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _stop_pids(pids: Sequence[int], *, grace: float = 5.0) -> None:
    """SIGTERM all, wait up to ``grace`` seconds for all of them, then SIGKILL the rest."""
    live = [pid for pid in pids if _alive(pid)]
    for pid in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [pid for pid in live if _alive(pid)]
    for pid in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [pid for pid in live if _alive(pid)]


def _kwokctl_line(line: str) -> str:
    """kwokctl logs JSON; keep level, message and elapsed time for the progress output."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line
    if not isinstance(rec, dict) or "msg" not in rec:
        return line
    extra = " ".join(f"{k}={rec[k]}" for k in ("component", "err") if k in rec)
    elapsed = (rec.get("elapsed") or {}).get("human", "") if isinstance(rec.get("elapsed"), dict) else ""
    text = f"{rec.get('level', 'INFO')} {rec['msg']} {extra}".rstrip()
    return f"{text} ({elapsed})" if elapsed else text


def _free_port() -> int:
    return ports.free_port(LOCALHOST)


def _https_get_insecure(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET a loopback health endpoint of a component that serves a self-signed cert."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
        return int(resp.status), resp.read().decode()


class Cluster:
    """A running test bed cluster. Create with :meth:`create`; always :meth:`delete` (or use ``with``)."""

    def __init__(self, config: ClusterConfig, binaries: Binaries, workdir: Path, owns_workdir: bool) -> None:
        self.config = config
        self.binaries = binaries
        self.workdir = workdir
        self._owns_workdir = owns_workdir
        self._progress = Progress(f"testbed:{config.name}", enabled=config.progress)
        self._children: list[subprocess.Popen[bytes]] = []
        self._known_pids: set[int] = set()
        self._deleted = False
        self.front_proxy: FrontProxyPki | None = None
        self.timings: dict[str, float] = {}
        self._port_overrides: dict[str, int] = {}
        self.kubelet_client: KubeletClientPki | None = None
        self.real_nodes: list[RealNode] = []

    # ---------------------------------------------------------------- paths and endpoints
    @property
    def cluster_dir(self) -> Path:
        """``$KWOK_WORKDIR/clusters/<name>`` (pki/, logs/, pids/, kubeconfig.yaml, kwok.yaml)."""
        return self.workdir / "clusters" / self.config.name

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client cert in ``system:masters``) pointing at https://127.0.0.1:<port>."""
        return self.cluster_dir / "kubeconfig.yaml"

    @property
    def server(self) -> str:
        """The API server URL from the kubeconfig."""
        doc = yaml.safe_load(self.kubeconfig.read_text())
        return str(doc["clusters"][0]["cluster"]["server"])

    @property
    def ca_cert(self) -> Path:
        """The cluster CA (kwokctl's ``pki/ca.crt``); signs the API server serving cert and client certs."""
        return self.cluster_dir / "pki" / "ca.crt"

    def _env(self) -> dict[str, str]:
        # Drop KUBECONFIG and any KWOK_* override from the caller's environment: kwokctl reads KWOK_* env vars
        # with priority over the config file, so a stray one would silently change the cluster.
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("KWOK_")}
        env["PATH"] = f"{self.binaries.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["KWOK_WORKDIR"] = str(self.workdir)
        env["KWOK_RUNTIME"] = "binary"
        return env

    # ---------------------------------------------------------------- creation
    @classmethod
    def create(cls, config: ClusterConfig | None = None, binaries: Binaries | None = None) -> Cluster:
        """Bring the cluster up and wait until API server, controllers and scheduler are ready."""
        config = config or ClusterConfig()
        binaries = binaries or Binaries.locate()
        if config.workdir is None:
            workdir, owns = Path(tempfile.mkdtemp(prefix=f"gw-testbed-{config.name}-")), True
        else:
            workdir, owns = config.workdir.resolve(), False
            workdir.mkdir(parents=True, exist_ok=True)
        attempts = 2
        for attempt in range(1, attempts + 1):
            cluster = cls(config, binaries, workdir, owns)
            try:
                cluster._create()
            except Exception as exc:
                cluster._dump_logs_tail()
                cluster._owns_workdir = owns and attempt == attempts
                cluster.delete()
                if attempt == attempts:
                    raise
                # Typically a port taken by another cluster starting at the same moment; new ports, once.
                cluster._progress(f"cluster creation failed ({exc}); retrying with new ports")
            except BaseException:
                cluster.delete()
                raise
            else:
                return cluster
        raise AssertionError("unreachable")

    def _kwokctl_config(self, scheduler_path: Path) -> list[dict[str, Any]]:
        b = self.binaries
        assert self.front_proxy is not None
        fp = self.front_proxy
        c = self.config
        apiserver_args: dict[str, str] = {
            # Aggregation layer (kwokctl <= v0.8.0 passes only --proxy-client-*; kwok#1679/#1680).
            "requestheader-client-ca-file": str(fp.ca_cert),
            "requestheader-allowed-names": FRONT_PROXY_CLIENT_CN,
            "requestheader-username-headers": "X-Remote-User",
            "requestheader-group-headers": "X-Remote-Group",
            "requestheader-extra-headers-prefix": "X-Remote-Extra-",
            "enable-aggregator-routing": "false",
            # Loopback only: never pick the default-route interface, never publish a loopback Endpoints.
            "advertise-address": LOCALHOST,
            "endpoint-reconciler-type": "none",
            "service-cluster-ip-range": SERVICE_CIDR,
        }
        if self.kubelet_client is not None:
            kc = self.kubelet_client
            # The real node's kubelet accepts only this identity (x509) and asks us to authorize it (webhook).
            apiserver_args["kubelet-client-certificate"] = str(kc.client_cert)
            apiserver_args["kubelet-client-key"] = str(kc.client_key)
            apiserver_args["enable-admission-plugins"] = "NodeRestriction"
            # The node name does not resolve here; dial the kubelet at its InternalIP (logs, exec).
            apiserver_args["kubelet-preferred-address-types"] = "InternalIP"
        if c.pod_network:
            apiserver_args["advertise-address"] = node_ip()
            apiserver_args["endpoint-reconciler-type"] = "lease"
        apiserver_args.update(c.extra_apiserver_args)
        kcm_args: dict[str, str] = {
            "controllers": c.kcm_controllers,
            "leader-elect": "false",
            "horizontal-pod-autoscaler-sync-period": c.hpa_sync_period,
            "horizontal-pod-autoscaler-downscale-stabilization": c.hpa_downscale_stabilization,
            "horizontal-pod-autoscaler-initial-readiness-delay": c.hpa_initial_readiness_delay,
            "horizontal-pod-autoscaler-tolerance": str(c.hpa_tolerance),
            **c.extra_kcm_args,
        }
        apiserver_patch: list[dict[str, Any]] = [
            # kwokctl points these at its shared admin cert; give the API server its own front-proxy identity.
            {"key": "proxy-client-cert-file", "value": str(fp.client_cert), "override": True},
            {"key": "proxy-client-key-file", "value": str(fp.client_key), "override": True},
        ]
        if c.pod_network:
            # Reachable from pods at the node IP (kwokctl binds every component to bindAddress).
            apiserver_patch.append({"key": "bind-address", "value": "0.0.0.0", "override": True})
        apiserver_patch += [{"key": k, "value": v} for k, v in apiserver_args.items()]
        docs = [
            {
                "kind": "KwokctlConfiguration",
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "options": {
                    "runtime": "binary",
                    **({"kubeVersion": b.kube_version} if b.kube_version else {}),
                    **({"etcdVersion": b.etcd_version} if b.etcd_version else {}),
                    "bindAddress": LOCALHOST,
                    # Our own random free ports: kwokctl would scan down from 32766, so two clusters created
                    # at the same moment (parallel test sessions) would pick the same ones.
                    **{key: _free_port() for key in _PORT_OPTIONS},
                    "cacheDir": str(self.workdir / "cache"),
                    "kubeApiserverBinary": str(b.path("kube-apiserver")),
                    "kubeControllerManagerBinary": str(b.path("kube-controller-manager")),
                    "kubeSchedulerBinary": str(b.path("kube-scheduler")),
                    "kubectlBinary": str(b.path("kubectl")),
                    "kwokControllerBinary": str(b.path("kwok")),
                    "etcdBinary": str(b.path("etcd")),
                    "kubeSchedulerConfig": str(scheduler_path),
                    "disableQPSLimits": True,
                    # kwokctl adds every address of this machine (the node IP too); pods dial these.
                    **({"kubeApiserverCertSANs": list(KUBERNETES_SERVICE_SANS)} if c.pod_network else {}),
                    **c.kwokctl_options,
                },
                "componentsPatches": [
                    {"name": "kube-apiserver", "extraArgs": apiserver_patch},
                    {
                        "name": "kube-controller-manager",
                        "extraArgs": [{"key": k, "value": v} for k, v in kcm_args.items()],
                    },
                    *self._kwok_controller_patch(),
                ],
            }
        ]
        if c.kwok_options:
            docs.append(
                {
                    "kind": "KwokConfiguration",
                    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                    "options": dict(c.kwok_options),
                }
            )
        return docs

    def _kwok_controller_patch(self) -> list[dict[str, Any]]:
        """With a real node, kwok must not heartbeat it or play its pods: manage annotated fake nodes only."""
        if not self.config.real_nodes:
            return []
        return [
            {
                "name": "kwok-controller",
                "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false", "override": True},
                    {"key": "manage-nodes-with-annotation-selector", "value": f"{FAKE_NODE_ANNOTATION}=fake"},
                ],
            }
        ]

    def _create(self) -> None:
        p = self._progress
        c = self.config
        versions = ", ".join(
            f"{k} {v}" for k, v in self.binaries.versions.items() if k in ("kubernetes", "etcd", "kwok")
        )
        p(f"creating cluster {c.name!r} in {self.workdir} ({versions or self.binaries.bin_dir})")
        self.front_proxy = write_front_proxy_pki(self.workdir / "front-proxy")
        if c.pod_network and not c.real_nodes:
            raise ClusterError("pod_network needs a real node (kube-proxy runs on it)")
        if c.real_nodes:
            if len(c.real_nodes) > 1:
                raise ClusterError(
                    "at most one real kubelet node per machine (fixed device-plugin directory)"
                )
            self.kubelet_client = write_kubelet_client_pki(
                self.workdir / "kubelet-client", make_ca("gpuwarden-testbed-kubelet-client-ca")
            )
        scheduler_path = self.workdir / "scheduler-config.yaml"
        scheduler_path.write_text(yaml.safe_dump(dict(c.scheduler_config or scheduler_configuration())))
        config_path = self.workdir / "kwokctl.yaml"
        config_path.write_text(yaml.safe_dump_all(self._kwokctl_config(scheduler_path), sort_keys=False))
        cmd = [
            str(self.binaries.path("kwokctl")),
            "--name",
            c.name,
            "--config",
            str(config_path),
            "create",
            "cluster",
            "--runtime",
            "binary",
            "--kubeconfig",
            "",
            "--timeout",
            f"{int(c.ready_timeout)}s",
        ]
        t0 = time.monotonic()
        log_path = self.workdir / "kwokctl-create.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, env=self._env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.workdir
            )
            assert proc.stdout is not None
            for raw in proc.stdout:
                log.write(raw)
                line = _kwokctl_line(raw.decode(errors="replace").rstrip())
                if line:
                    p(f"kwokctl: {line}")
            rc = proc.wait(timeout=c.ready_timeout)
        self._remember_pids()
        if rc != 0:
            raise ClusterError(f"kwokctl create cluster failed (rc={rc}); see {log_path}")
        self.timings["kwokctl_create_s"] = time.monotonic() - t0
        p(f"components started in {self.timings['kwokctl_create_s']:.1f}s; waiting for readiness")
        self._wait_ready()
        self.timings["ready_s"] = time.monotonic() - t0
        p(f"cluster ready in {self.timings['ready_s']:.1f}s at {self.server} (kubeconfig {self.kubeconfig})")
        for spec in c.real_nodes:
            self._start_real_node(spec)

    def _start_real_node(self, spec: RealNodeSpec) -> None:
        assert self.kubelet_client is not None
        node = RealNode(
            spec,
            kubelet_binary=self.binaries.path("kubelet"),
            ctl_binary=self.binaries.path("kubectl"),
            server=self.server,
            cluster_ca=load_keypair(self.ca_cert, self.cluster_dir / "pki" / "ca.key"),
            kubelet_client_ca=self.kubelet_client.ca_cert,
            cache_dir=self.binaries.bin_dir.parent.parent / "images",
            progress=Progress(f"testbed:{self.config.name}:{spec.name}", enabled=self.config.progress),
        )
        self.real_nodes.append(node)
        try:
            node.start()
        except RealNodeError as exc:
            raise ClusterError(f"real node {spec.name}: {exc}") from exc
        self.timings[f"{spec.name}_ready_s"] = node.timings.get("node_ready_s", 0.0)
        if self.config.pod_network:
            try:
                node.start_kube_proxy(self.binaries.path("kube-proxy"), self.kubeconfig, SERVICE_CIDR)
            except RealNodeError as exc:
                raise ClusterError(f"real node {spec.name}: {exc}") from exc

    def real_node(self, name: str | None = None) -> RealNode:
        """The running real kubelet node (the only one, or the one named)."""
        for node in self.real_nodes:
            if name is None or node.name == name:
                return node
        raise ClusterError(f"no real kubelet node {name or ''} in this cluster")

    def _wait_ready(self) -> None:
        timeout = self.config.ready_timeout
        poll(
            lambda: self.kubectl("get", "--raw", "/readyz", check=False) == "ok",
            timeout=timeout,
            what="kube-apiserver /readyz",
        )
        self._progress("kube-apiserver ready")
        poll(
            lambda: self._component_healthy("kube-controller-manager"),
            timeout=timeout,
            what="kube-controller-manager /healthz",
        )
        poll(
            lambda: self._component_healthy("kube-scheduler"), timeout=timeout, what="kube-scheduler /readyz"
        )
        self._progress("kube-controller-manager and kube-scheduler healthy")
        # The ServiceAccount admission plugin rejects pods until the token controller made "default".
        poll(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False),
            timeout=timeout,
            what="default ServiceAccount (kube-controller-manager running)",
        )
        poll(
            self._extension_auth_has_requestheader,
            timeout=timeout,
            what="requestheader-client-ca-file in kube-system/extension-apiserver-authentication",
        )

    def _extension_auth_has_requestheader(self) -> bool:
        out = self.kubectl(
            "get",
            "configmap",
            "extension-apiserver-authentication",
            "-n",
            "kube-system",
            "-o",
            "json",
            check=False,
        )
        return bool(out) and "requestheader-client-ca-file" in json.loads(out).get("data", {})

    # ---------------------------------------------------------------- kwokctl state
    def saved_config(self) -> dict[str, Any]:
        """The KwokctlConfiguration kwokctl saved for this cluster (options with real ports, components)."""
        for doc in yaml.safe_load_all((self.cluster_dir / "kwok.yaml").read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "KwokctlConfiguration":
                return doc
        raise ClusterError(f"no KwokctlConfiguration in {self.cluster_dir / 'kwok.yaml'}")

    def component(self, name: str) -> dict[str, Any]:
        """One entry of the saved ``components`` list (binary, args, workDir, ports)."""
        for comp in self.saved_config().get("components") or []:
            if comp.get("name") == name:
                return dict(comp)
        raise ClusterError(f"component {name!r} not found in saved kwokctl configuration")

    def component_port(self, name: str) -> int:
        """The port a component (e.g. kube-scheduler, for its /metrics) serves HTTPS on right now."""
        return self._component_port(name)

    def _component_port(self, name: str) -> int:
        if name in self._port_overrides:
            return self._port_overrides[name]
        for arg in self.component(name).get("args") or []:
            if str(arg).startswith("--secure-port="):
                return int(str(arg).split("=", 1)[1])
        raise ClusterError(f"no --secure-port for {name}")

    def _component_healthy(self, name: str) -> bool:
        path = "/readyz" if name == "kube-scheduler" else "/healthz"
        status, body = _https_get_insecure(f"https://{LOCALHOST}:{self._component_port(name)}{path}")
        return status == 200 and body.strip() == "ok"

    def pid_files(self) -> dict[str, Path]:
        """Component name -> pid file written by kwokctl (or by :meth:`restart_scheduler`)."""
        pids_dir = self.cluster_dir / "pids"
        return {f.stem: f for f in sorted(pids_dir.glob("*.pid"))} if pids_dir.is_dir() else {}

    def pids(self) -> dict[str, int]:
        """Component name -> pid of the running control-plane processes."""
        out: dict[str, int] = {}
        for name, f in self.pid_files().items():
            with contextlib.suppress(OSError, ValueError):
                out[name] = int(f.read_text().strip())
        return out

    def _remember_pids(self) -> None:
        self._known_pids.update(self.pids().values())

    def control_plane_peak_rss(self) -> dict[str, int]:
        """Peak resident memory (bytes, ``VmHWM``) per running control-plane process, over its lifetime."""
        return {name: process_memory(pid, "VmHWM") for name, pid in self.pids().items() if _alive(pid)}

    def control_plane_rss(self) -> dict[str, int]:
        """Resident memory (bytes) per running control-plane process."""
        return {name: process_memory(pid) for name, pid in self.pids().items() if _alive(pid)}

    def logs(self, component: str) -> Path:
        """Log file of one component."""
        return self.cluster_dir / "logs" / f"{component}.log"

    def _dump_logs_tail(self, lines: int = 15) -> None:
        logs_dir = self.cluster_dir / "logs"
        if not logs_dir.is_dir():
            return
        for f in sorted(logs_dir.glob("*.log")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            print(f"----- {f} (last {len(tail)} lines)", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)

    # ---------------------------------------------------------------- clients
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0) -> str:
        """Run the built kubectl against this cluster; return stdout ("" on failure when not ``check``)."""
        cmd = [str(self.binaries.path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, env=self._env()
        )
        if res.returncode != 0:
            if check:
                raise ClusterError(
                    f"kubectl {' '.join(args)} failed (rc={res.returncode}): {res.stderr.strip()}"
                )
            return ""
        return res.stdout

    def apply(self, *objects: Mapping[str, Any]) -> str:
        """``kubectl apply`` the given objects (server-side, so status of created Nodes is kept)."""
        doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objects]}
        return self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))

    def get_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get ... -o json`` parsed."""
        result: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return result

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for this cluster (close it when done)."""
        from kubernetes import config as kube_config

        return kube_config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    # ---------------------------------------------------------------- scheduler
    def scheduler_config_path(self) -> Path:
        """The KubeSchedulerConfiguration file kube-scheduler was started with."""
        for arg in self.component("kube-scheduler").get("args") or []:
            if str(arg).startswith("--config="):
                return Path(str(arg).split("=", 1)[1])
        raise ClusterError("kube-scheduler was started without --config")

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler (pods queue up unscheduled); :meth:`restart_scheduler` starts it again."""
        pid_file = self.pid_files().get("kube-scheduler")
        if pid_file is not None:
            _stop_pids([int(pid_file.read_text().strip())])

    def restart_scheduler(self, scheduler_config: Mapping[str, Any]) -> None:
        """Stop kube-scheduler, install a new KubeSchedulerConfiguration, start it again, wait for /readyz.

        The same binary and flags kwokctl used are reused. If the old port was taken by someone else in the
        moment between stop and start (other clusters on this machine), the scheduler moves to a free port.
        """
        comp = self.component("kube-scheduler")
        path = self.scheduler_config_path()
        old = yaml.safe_load(path.read_text()) or {}
        new = dict(scheduler_config)
        new["clientConnection"] = {
            **dict(new.get("clientConnection") or {}),
            **(old.get("clientConnection") or {}),
        }
        pid_file = self.pid_files().get("kube-scheduler")
        if pid_file is not None:
            _stop_pids([int(pid_file.read_text().strip())])
        path.write_text(yaml.safe_dump(new))
        workdir = Path(str(comp.get("workDir") or self.cluster_dir))
        base_args = [str(a) for a in comp.get("args") or [] if not str(a).startswith("--secure-port=")]
        for attempt in range(3):
            port = self._component_port("kube-scheduler") if attempt == 0 else _free_port()
            with self.logs("kube-scheduler").open("ab") as log:
                child = subprocess.Popen(
                    [str(comp["binary"]), *base_args, f"--secure-port={port}"],
                    cwd=workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=self._env(),
                )
            self._children.append(child)
            self._known_pids.add(child.pid)
            (self.cluster_dir / "pids" / "kube-scheduler.pid").write_text(str(child.pid))
            if self._wait_child_ready(child, port, timeout=60):
                self._port_overrides["kube-scheduler"] = port
                self._progress(
                    f"kube-scheduler restarted with new configuration (pid {child.pid}, port {port})"
                )
                return
            self._progress(
                f"restarted kube-scheduler exited (rc={child.returncode}) on port {port}; retrying"
            )
        raise ClusterError(f"kube-scheduler did not come back; see {self.logs('kube-scheduler')}")

    def _wait_child_ready(self, child: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
        """True once our own child answers /readyz; False if it exited (e.g. port already in use)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                status, body = _https_get_insecure(f"https://{LOCALHOST}:{port}/readyz")
                if status == 200 and body.strip() == "ok" and child.poll() is None:
                    return True
            time.sleep(0.2)
        raise ClusterError(f"restarted kube-scheduler not ready after {timeout:.0f}s on port {port}")

    # ---------------------------------------------------------------- API server
    def apiserver_args(self, extra_args: Mapping[str, str] | None = None) -> list[str]:
        """kube-apiserver's command-line flags as kwokctl started it, each of ``extra_args`` (flag name
        without dashes -> value) replacing the flag of that name or, when it has none, added at the end."""
        extra = dict(extra_args or {})
        args: list[str] = []
        for arg in (str(a) for a in self.component("kube-apiserver").get("args") or []):
            name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
            if name in extra:
                args.append(f"--{name}={extra.pop(name)}")
            else:
                args.append(arg)
        return args + [f"--{k}={v}" for k, v in extra.items()]

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, SIGKILL after 5 s); etcd and every other component keep running.
        :meth:`start_apiserver` starts it again."""
        pid = self.pids().get("kube-apiserver")
        if pid is not None:
            _stop_pids([pid])

    def start_apiserver(self, extra_args: Mapping[str, str] | None = None, *, timeout: float = 120.0) -> None:
        """Start kube-apiserver on the same etcd, port and certificates, with kwokctl's flags plus
        ``extra_args`` (see :meth:`apiserver_args`), and wait for its /readyz.

        Flags are taken from kwokctl's saved configuration each time, so a start without ``extra_args``
        restores the original ones. E.g. ``watch-cache-sizes=nodes#0`` with ``etcd-compaction-interval=2s``
        serves node watches from etcd and compacts often: a watch resumed from a compacted resourceVersion
        then gets 410 Gone (the watch cache would serve it from memory instead).
        """
        if _alive(self.pids().get("kube-apiserver", -1)):
            raise ClusterError("kube-apiserver is running; stop_apiserver() first")
        comp = self.component("kube-apiserver")
        workdir = Path(str(comp.get("workDir") or self.cluster_dir))
        env = self._env()
        env.update({str(e["name"]): str(e.get("value", "")) for e in comp.get("envs") or []})
        with self.logs("kube-apiserver").open("ab") as log:
            child = subprocess.Popen(
                [str(comp["binary"]), *self.apiserver_args(extra_args)],
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self._children.append(child)
        self._known_pids.add(child.pid)
        (self.cluster_dir / "pids" / "kube-apiserver.pid").write_text(str(child.pid))

        def ready() -> bool:
            if child.poll() is not None:
                raise ClusterError(
                    f"kube-apiserver exited (rc={child.returncode}); see {self.logs('kube-apiserver')}"
                )
            return self.kubectl("get", "--raw", "/readyz", check=False, timeout=10) == "ok"

        poll(ready, timeout=timeout, what="restarted kube-apiserver /readyz")
        flags = " ".join(f"--{k}={v}" for k, v in (extra_args or {}).items())
        self._progress(f"kube-apiserver started (pid {child.pid}{', ' + flags if flags else ''})")

    def restart_apiserver(
        self, extra_args: Mapping[str, str] | None = None, *, timeout: float = 120.0
    ) -> float:
        """:meth:`stop_apiserver` then :meth:`start_apiserver`; returns the seconds until /readyz was ok."""
        t0 = time.monotonic()
        self.stop_apiserver()
        self.start_apiserver(extra_args, timeout=timeout)
        return time.monotonic() - t0

    # ---------------------------------------------------------------- teardown
    def delete_apiservices(self) -> list[str]:
        """Delete every APIService backed by a Service (i.e. not served by kube-apiserver itself)."""
        out = self.kubectl("get", "apiservices", "-o", "json", check=False, timeout=15)
        if not out:
            return []
        names = [
            i["metadata"]["name"] for i in json.loads(out)["items"] if (i.get("spec") or {}).get("service")
        ]
        if names:
            self.kubectl("delete", "apiservice", *names, "--wait=false", check=False, timeout=15)
        return names

    def delete(self) -> None:
        """Tear down: APIServices first, then kwokctl delete, then kill any leftover process by pid."""
        if self._deleted:
            return
        self._deleted = True
        p = self._progress
        for node in self.real_nodes:
            # Before the control plane goes: the kubelet would otherwise spend its shutdown retrying the API.
            with contextlib.suppress(Exception):
                node.copy_logs(self.workdir / f"logs-{node.name}")
            node.stop()
        if self.kubeconfig.is_file():
            with contextlib.suppress(Exception):
                removed = self.delete_apiservices()
                if removed:
                    p(f"deleted APIServices {', '.join(removed)}")
        self._remember_pids()
        logs_dir = self.cluster_dir / "logs"
        if logs_dir.is_dir() and not self._owns_workdir:
            shutil.copytree(logs_dir, self.workdir / f"logs-{self.config.name}", dirs_exist_ok=True)
        if self.cluster_dir.is_dir():
            # `delete cluster` rejects --kubeconfig "" ("empty path"); give it a file of ours that has no
            # context for this cluster, so ~/.kube/config is never read or written.
            unused = self.workdir / "unused-host-kubeconfig.yaml"
            with contextlib.suppress(subprocess.TimeoutExpired):
                res = subprocess.run(
                    [
                        str(self.binaries.path("kwokctl")),
                        "--name",
                        self.config.name,
                        "delete",
                        "cluster",
                        "--kubeconfig",
                        str(unused),
                    ],
                    env=self._env(),
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                if res.returncode != 0:
                    p(f"kwokctl delete cluster failed (rc={res.returncode}): {res.stderr.strip()[-300:]}")
        _stop_pids(sorted(self._known_pids))
        for child in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        leftovers = [pid for pid in self._known_pids if _alive(pid)]
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        p("cluster deleted" + (f"; processes still alive: {leftovers}" if leftovers else ""))
        if leftovers:
            raise ClusterError(f"processes survived teardown: {leftovers}")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()


@contextlib.contextmanager
def running_cluster(
    config: ClusterConfig | None = None, binaries: Binaries | None = None
) -> Iterator[Cluster]:
    """``with running_cluster(cfg) as cluster:`` — create, yield, always delete."""
    cluster = Cluster.create(config, binaries)
    try:
        yield cluster
    finally:
        cluster.delete()


def ensure_namespace(
    cluster: Cluster, name: str, labels: Mapping[str, str] | None = None, timeout: float = 60
) -> None:
    """Create a namespace (idempotent) and wait for its default ServiceAccount (pods need it)."""
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
    )
    poll(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False),
        timeout=timeout,
        what=f"default ServiceAccount in namespace {name}",
    )


def sum_rss(rss: Mapping[str, int], components: Sequence[str] = COMPONENTS) -> int:
    """Sum of the RSS of the named components."""
    return sum(v for k, v in rss.items() if k in components)
