"""One real kubelet node beside the kwok fleet: kubelet v1.37.2 (v1.35.4 in `make test-oldest`) on
containerd 1.6 + runc + a CNI bridge.

kwok nodes run no kubelet, so nothing that ends on a node (a device plugin's Allocate, the PodResources API,
graceful termination after an Eviction, ``kubectl logs``) can be proven on them. A :class:`RealNode` runs the
real thing as plain processes of this harness, never through a service manager and never on the system's
containerd paths:

* **containerd** (Debian's 1.6) with its own config, socket, root and state under a short run directory
  (``/tmp/gwtb-*``: unix socket paths are limited to 108 bytes), the CRI plugin's ``sandbox_image`` set to the
  locally built pause image, ``SystemdCgroup = false`` (the kubelet's ``cgroupDriver: cgroupfs``), and
  ``restrict_oom_score_adj = true`` because this machine's root lacks CAP_SYS_RESOURCE (runc fails with
  ``can't get final child's PID from pipe: EOF`` otherwise);
* a **CNI bridge** conflist (bridge + host-local; loopback is added by containerd itself) with its own bridge
  name, subnet and IPAM data directory;
* the two **images** of :mod:`harness.testbed.images`, imported into containerd's ``k8s.io`` namespace;
* the **kubelet**, registered as ``system:node:<name>`` (group ``system:nodes``) with a client certificate
  signed by the cluster CA, so the Node authorizer and NodeRestriction admission apply to it as to any
  node. Its own API (logs) accepts only the API server's kubelet-client certificate and asks the API
  server to authorize (webhook), as on a kubeadm node. It registers labelled
  ``gpuwarden.io/real-kubelet=true`` and tainted ``gpuwarden.io/real-kubelet=true:NoSchedule``, so only
  pods that ask for it land there.

The kubelet's device-plugin directory is fixed at ``/var/lib/kubelet/device-plugins`` whatever ``--root-dir``
says, so only one real node can run on a machine at a time: :class:`RealNode` takes an exclusive lock
(``/var/lib/kubelet/gpuwarden-testbed.lock``) and refuses a second one with a message naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from gpuwarden import ports
from harness.testbed.images import PAUSE_IMAGE, build_archives
from harness.testbed.pki import KeyPair, issue
from harness.testbed.waiting import Progress, poll

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""Fixed by the kubelet (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 ``DevicePluginPath``)."""
KUBELET_SOCKET = DEVICE_PLUGIN_DIR / "kubelet.sock"
LOCK_PATH = Path("/var/lib/kubelet/gpuwarden-testbed.lock")
STANDARD_POD_RESOURCES = Path("/var/lib/kubelet/pod-resources")
CNI_BIN_DIR = Path("/usr/lib/cni")
"""Debian's containernetworking-plugins install location."""
REAL_NODE_LABEL = "gpuwarden.io/real-kubelet"
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
RUNTIME_PACKAGES = {"containerd": "containerd", "ctr": "containerd", "runc": "runc"}
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CGROUP_V1_REQUIRED = ("cpu", "cpuacct", "cpuset", "memory")


class RealNodeError(RuntimeError):
    """The real kubelet node could not be started (the message names the failing piece)."""


@dataclass(frozen=True)
class RealNodeSpec:
    """One real kubelet node."""

    name: str = "real-node-0"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = (REAL_NODE_TAINT,)
    max_pods: int = 32
    bridge: str = "gwtb0"
    subnet: str = "10.244.250.0/24"
    ready_timeout: float = 120.0
    kubelet_verbosity: int = 2
    standard_pod_resources_path: bool = False
    """Also offer the PodResources socket at ``/var/lib/kubelet/pod-resources`` (a symlink to this node's),
    where a DaemonSet's hostPath expects it (the chart's node agent); removed on stop."""
    images: Sequence[Path] = ()
    """OCI image archives imported beside the test bed's own two (e.g. the product image of ``make image``),
    each under the reference its ``index.json`` names."""


@dataclass(frozen=True)
class KubeletClientPki:
    """The API server's client identity towards kubelets (``--kubelet-client-certificate``) and its CA."""

    ca_cert: Path
    client_cert: Path
    client_key: Path


def write_kubelet_client_pki(directory: Path, ca: KeyPair) -> KubeletClientPki:
    """CN ``kube-apiserver-kubelet-client``, group ``system:masters`` (the kubelet's webhook allows it)."""
    client = issue(ca, "kube-apiserver-kubelet-client", organizations=("system:masters",), client=True)
    ca_cert, _ = ca.write(directory, "kubelet-client-ca")
    cert, key = client.write(directory, "kubelet-client")
    return KubeletClientPki(ca_cert=ca_cert, client_cert=cert, client_key=key)


def check_prerequisites() -> list[str]:
    """What this machine lacks to run a real node, each with the package or setting that cures it."""
    problems: list[str] = []
    for binary, package in RUNTIME_PACKAGES.items():
        if shutil.which(binary) is None:
            problems.append(f"{binary} not on PATH (Debian package {package}; `make node-runtime`)")
    for plugin in CNI_PLUGINS:
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            problems.append(f"{CNI_BIN_DIR / plugin} missing (Debian containernetworking-plugins)")
    if shutil.which("gcc") is None:
        problems.append("gcc not on PATH (the pause and tool images are compiled from C)")
    if shutil.which("ip") is None:
        problems.append("ip not on PATH (Debian iproute2; the CNI bridge is removed with it)")
    for subsystem in CGROUP_V1_REQUIRED:
        if (
            not Path("/sys/fs/cgroup", subsystem).is_dir()
            and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
        ):
            problems.append(f"cgroup subsystem {subsystem} not mounted under /sys/fs/cgroup")
    if os.geteuid() != 0:
        problems.append("not root: the kubelet and containerd need root")
    return problems


def node_ip() -> str:
    """The address of the default-route interface (the kubelet refuses a loopback node IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent; this only picks the route's source address
        except OSError as exc:
            raise RealNodeError(f"no default route to pick a node IP from ({exc})") from exc
        ip = str(s.getsockname()[0])
    if ip.startswith("127."):
        raise RealNodeError(
            f"the default-route address is loopback ({ip}); the kubelet refuses it as node IP"
        )
    return ip


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    out: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _kill(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    live = [p for p in pids if _alive(p)]
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [p for p in live if _alive(p)]
    return live


def _mounts_under(prefixes: Sequence[Path]) -> list[str]:
    out: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    roots = [str(p).rstrip("/") + "/" for p in prefixes]
    for line in lines:
        mountpoint = line.split()[4].replace("\\040", " ")
        if any((mountpoint + "/").startswith(r) for r in roots):
            out.append(mountpoint)
    return out


def _archive_ref(archive: Path) -> str:
    """The image reference an OCI archive's ``index.json`` names (what ``ctr images import`` calls it)."""
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        if index is None:
            raise RealNodeError(f"{archive}: no index.json (not an OCI archive)")
        manifests = json.load(index).get("manifests") or [{}]
    ref = str((manifests[0].get("annotations") or {}).get("org.opencontainers.image.ref.name", ""))
    if "/" not in ref:
        raise RealNodeError(f"{archive}: index.json names no fully qualified image reference ({ref!r})")
    return ref


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RealNode:
    """A running real kubelet node. Start with :meth:`start`; always :meth:`stop` (or use ``with``)."""

    def __init__(
        self,
        spec: RealNodeSpec,
        *,
        kubelet_binary: Path,
        ctl_binary: Path,
        server: str,
        cluster_ca: KeyPair,
        kubelet_client_ca: Path,
        cache_dir: Path,
        progress: Progress | None = None,
    ) -> None:
        self.spec = spec
        self.kubelet_binary = kubelet_binary
        self.kubectl_binary = ctl_binary
        self.server = server
        self._cluster_ca = cluster_ca
        self._kubelet_client_ca = kubelet_client_ca
        self._cache_dir = cache_dir
        self._progress = progress or Progress(f"realnode:{spec.name}")
        self.run_dir = Path(tempfile.mkdtemp(prefix="gwtb-", dir="/tmp"))
        self._lock: IO[str] | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._cmds: dict[str, list[str]] = {}
        self._netns_before: set[str] = set()
        self._kubelet_chains_before: set[tuple[str, str]] = set()
        self._stopped = False
        self.timings: dict[str, float] = {}
        self.node_ip = ""
        self.kubelet_port = 0
        self.healthz_port = 0
        self._kube_proxy_binary: Path | None = None

    # ---------------------------------------------------------------- paths
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.run_dir / "kubelet"

    @property
    def kubeconfig(self) -> Path:
        """The node's credentials (``system:node:<name>``), for node-level agents such as a DRA driver."""
        return self.run_dir / "kubelet.kubeconfig"

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet PodResources API (``<root-dir>/pod-resources/kubelet.sock``)."""
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def device_plugin_dir(self) -> Path:
        """Where device plugins put their sockets and find ``kubelet.sock`` (fixed by the kubelet)."""
        return DEVICE_PLUGIN_DIR

    @property
    def pod_logs_dir(self) -> Path:
        return self.run_dir / "pod-logs"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    def log(self, component: str) -> Path:
        """``kubelet`` or ``containerd`` log file."""
        return self.logs_dir / f"{component}.log"

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items() if p.poll() is None}

    def rss(self) -> dict[str, int]:
        """Resident memory (bytes) of kubelet and containerd (and the sum of their shims as ``shims``)."""
        out = {name: _rss(pid) for name, pid in self.pids().items()}
        out["shims"] = sum(_rss(pid) for pid in self._shim_pids())
        return out

    # ---------------------------------------------------------------- start
    def start(self) -> RealNode:
        p = self._progress
        t0 = time.monotonic()
        try:
            problems = check_prerequisites()
            if problems:
                raise RealNodeError("cannot run a real kubelet node here: " + "; ".join(problems))
            self._take_lock()
            self._netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
            self._kubelet_chains_before = _kubelet_chains()
            for d in (self.logs_dir, self.pod_logs_dir, self.kubelet_root):
                d.mkdir(parents=True, exist_ok=True)
            self.node_ip = node_ip()
            if self.spec.standard_pod_resources_path:
                self._link_pod_resources()
            self._start_containerd()
            self.timings["containerd_s"] = time.monotonic() - t0
            p(f"containerd up in {self.timings['containerd_s']:.1f}s (socket {self.containerd_socket})")
            t1 = time.monotonic()
            imported = self._import_images()
            self.timings["images_s"] = time.monotonic() - t1
            p(f"images imported in {self.timings['images_s']:.1f}s: {', '.join(imported)}")
            t2 = time.monotonic()
            self._start_kubelet()
            self._wait_ready()
            self.timings["kubelet_ready_s"] = time.monotonic() - t2
            self.timings["node_ready_s"] = time.monotonic() - t0
            p(
                f"node {self.name} Ready: kubelet {self.timings['kubelet_ready_s']:.1f}s after start, "
                f"{self.timings['node_ready_s']:.1f}s in all (kubelet {self.node_ip}:{self.kubelet_port})"
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _link_pod_resources(self) -> None:
        link = STANDARD_POD_RESOURCES
        if link.is_symlink():
            link.unlink()  # a stale one of an earlier node (we hold the machine's lock)
        if link.exists():
            raise RealNodeError(f"{link} exists and is not a test bed symlink; refusing to replace it")
        (self.kubelet_root / "pod-resources").mkdir(parents=True, exist_ok=True)
        link.symlink_to(self.kubelet_root / "pod-resources")

    def _take_lock(self) -> None:
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        fh = LOCK_PATH.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise RealNodeError(
                f"another real-kubelet test bed node is running on this machine ({holder}); only one can run "
                f"at a time because the kubelet's device-plugin directory {DEVICE_PLUGIN_DIR} is fixed. "
                f"Stop it first (its lock: {LOCK_PATH})"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}, node {self.name}, run dir {self.run_dir}\n")
        fh.flush()
        self._lock = fh
        if KUBELET_SOCKET.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                try:
                    s.connect(str(KUBELET_SOCKET))
                except OSError:
                    pass  # a stale socket of a kubelet that is gone; the new kubelet removes it
                else:
                    raise RealNodeError(
                        f"a kubelet not started by this harness serves {KUBELET_SOCKET}; refusing to start a "
                        "second kubelet on the same device-plugin directory"
                    )

    def _spawn(self, name: str, cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        log = self.log(name).open("ab")
        # A session of its own: a test runner that ends its process group must not stop the node with it.
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self._procs[name] = proc
        self._cmds[name] = list(cmd)
        return proc

    def _ctr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def containerd_config(self) -> str:
        """containerd 1.6 config (version 2) with every path under the run directory."""
        base = self.run_dir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return "\n".join(
            [
                "version = 2",
                f'root = "{base / "root"}"',
                f'state = "{base / "state"}"',
                'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs",'
                ' "io.containerd.snapshotter.v1.zfs",'
                ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",'
                ' "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]',
                "[grpc]",
                f'  address = "{self.containerd_socket}"',
                "[ttrpc]",
                f'  address = "{base / "containerd.sock.ttrpc"}"',
                '[plugins."io.containerd.internal.v1.opt"]',
                f'  path = "{base / "opt"}"',
                f"[{cri}]",
                f'  sandbox_image = "{PAUSE_IMAGE.name}"',
                "  restrict_oom_score_adj = true",
                '  stream_server_address = "127.0.0.1"',
                '  stream_server_port = "0"',
                "  enable_selinux = false",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
                f"[{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri}.containerd.runtimes.runc.options]",
                "  SystemdCgroup = false",
                f"[{cri}.cni]",
                f'  bin_dir = "{CNI_BIN_DIR}"',
                f'  conf_dir = "{self.run_dir / "cni" / "net.d"}"',
                "  max_conf_num = 1",
                "",
            ]
        )

    def cni_conflist(self) -> dict[str, Any]:
        """bridge + host-local; no ipMasq/portmap, so no iptables binary is needed."""
        return {
            "cniVersion": "1.0.0",
            "name": "gpuwarden-testbed",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.spec.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.spec.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.run_dir / "cni" / "ipam"),
                    },
                }
            ],
        }

    def _start_containerd(self) -> None:
        conf_dir = self.run_dir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-gpuwarden-testbed.conflist").write_text(json.dumps(self.cni_conflist(), indent=2))
        config = self.run_dir / "containerd" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(self.containerd_config())
        proc = self._spawn("containerd", ["containerd", "--config", str(config), "--log-level", "info"])

        def answers() -> bool:
            if proc.poll() is not None:
                raise RealNodeError(
                    f"containerd exited (rc={proc.returncode}); last lines of {self.log('containerd')}:\n"
                    f"{_tail(self.log('containerd'))}"
                )
            return self._ctr("version", timeout=10).returncode == 0

        try:
            poll(answers, timeout=30, interval=0.1, what="containerd answering `ctr version`")
        except RealNodeError:
            raise
        except TimeoutError as exc:
            raise RealNodeError(
                f"{exc}; last lines of containerd's log:\n{_tail(self.log('containerd'))}"
            ) from exc

    def _import_images(self) -> list[str]:
        archives = {**build_archives(self._cache_dir), **{_archive_ref(a): a for a in self.spec.images}}
        for name, archive in archives.items():
            res = self._ctr("images", "import", "--no-unpack=false", str(archive), timeout=300)
            if res.returncode != 0:
                raise RealNodeError(f"ctr images import {archive} failed: {res.stderr.strip()[-500:]}")
            listed = self._ctr("images", "ls", "-q")
            if name not in listed.stdout.split():
                raise RealNodeError(
                    f"image {name} not in containerd after import; images: {listed.stdout.split()}"
                )
        return list(archives)

    # ---------------------------------------------------------------- kube-proxy
    def start_kube_proxy(
        self, binary: Path, kubeconfig: Path, service_cidr: str, *, timeout: float = 60.0
    ) -> None:
        """kube-proxy (iptables mode) for this node: pods reach Services, the API server's included.

        It runs as a plain process like the kubelet, with the cluster's admin credentials (a test bed
        shortcut for the ``system:node-proxier`` role), touching no sysctl it can avoid: conntrack limits
        left as they are, no localhost NodePorts (so no ``route_localnet``). :meth:`stop` ends it and runs
        ``kube-proxy --cleanup`` so no KUBE-* chain outlives the node.

        The Service range is routed into the node's bridge: a ClusterIP kube-proxy has no rule for (yet)
        then goes nowhere instead of out of the machine by the default route. The route goes with the bridge.
        """
        t0 = time.monotonic()
        self._kube_proxy_binary = binary
        bridge = self.spec.bridge
        for cmd in (
            ["ip", "link", "add", "name", bridge, "type", "bridge"],  # the CNI plugin adopts an existing one
            ["ip", "link", "set", bridge, "up"],
            ["ip", "route", "replace", service_cidr, "dev", bridge],
        ):
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0 and "File exists" not in res.stderr:
                raise RealNodeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
        healthz = ports.free_port("127.0.0.1")
        metrics = ports.free_port("127.0.0.1")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": self.spec.subnet,
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            "nodePortAddresses": ["primary"],
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s", "localhostNodePorts": False},
        }
        path = self.run_dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        proc = self._spawn("kube-proxy", [str(binary), f"--config={path}", "--v=2"])

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RealNodeError(
                    f"kube-proxy exited (rc={proc.returncode}); last lines of {self.log('kube-proxy')}:\n"
                    f"{_tail(self.log('kube-proxy'))}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{healthz}/healthz", timeout=2) as resp:
                    return int(resp.status) == 200
            except OSError:
                return False

        poll(healthy, timeout=timeout, interval=0.25, what="kube-proxy /healthz")
        self.timings["kube_proxy_s"] = time.monotonic() - t0
        self._progress(f"kube-proxy healthy in {self.timings['kube_proxy_s']:.1f}s (iptables mode)")

    def _write_credentials(self) -> Path:
        """The node's kubeconfig: client cert CN ``system:node:<name>``, O ``system:nodes``."""
        pki = self.run_dir / "pki"
        cert = issue(
            self._cluster_ca, f"system:node:{self.name}", organizations=("system:nodes",), client=True
        )
        cert_path, key_path = cert.write(pki, "node-client")
        ca_path = pki / "cluster-ca.crt"
        ca_path.write_bytes(self._cluster_ca.cert_pem)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "testbed", "cluster": {"server": self.server, "certificate-authority": str(ca_path)}}
            ],
            "users": [
                {
                    "name": self.name,
                    "user": {"client-certificate": str(cert_path), "client-key": str(key_path)},
                }
            ],
            "contexts": [{"name": "node", "context": {"cluster": "testbed", "user": self.name}}],
            "current-context": "node",
        }
        path = self.kubeconfig
        path.write_text(yaml.safe_dump(kubeconfig))
        return path

    def kubelet_configuration(self) -> dict[str, Any]:
        """The KubeletConfiguration for this host (see tests/testbed/README.md for each deviation)."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this host is cgroup v1 (hybrid); 1.35+ refuses v1 by default
            "cgroupDriver": "cgroupfs",  # containerd's SystemdCgroup = false; no systemd here
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "failSwapOn": False,
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True, "cacheTTL": "10s"},
                "x509": {"clientCAFile": str(self._kubelet_client_ca)},
            },
            "authorization": {"mode": "Webhook"},
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            # No registry: the pause image must never be garbage-collected (containerd 1.6 pins nothing).
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "podLogsDir": str(self.pod_logs_dir),
            "maxPods": self.spec.max_pods,
            "registerWithTaints": [dict(t) for t in self.spec.taints],
            "oomScoreAdj": 0,  # negative values need CAP_SYS_RESOURCE, which this machine's root lacks
            "clusterDomain": "cluster.local",
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "5s",
            "topologyManagerPolicy": "none",
            "shutdownGracePeriod": "0s",
        }

    def _start_kubelet(self) -> None:
        self.kubelet_port = ports.free_port("0.0.0.0")
        self.healthz_port = ports.free_port("127.0.0.1")
        kubeconfig = self._write_credentials()
        config = self.run_dir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_configuration(), sort_keys=False))
        labels = {REAL_NODE_LABEL: "true", **self.spec.labels}
        cmd = [
            str(self.kubelet_binary),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={self.run_dir / 'kubelet-pki'}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            f"--v={self.spec.kubelet_verbosity}",
        ]
        self._spawn("kubelet", cmd)

    def _kubectl_json(self, *args: str) -> dict[str, Any] | None:
        res = subprocess.run(
            [
                str(self.kubectl_binary),
                f"--kubeconfig={self.run_dir / 'kubelet.kubeconfig'}",
                *args,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        if res.returncode != 0:
            return None
        doc: dict[str, Any] = json.loads(res.stdout)
        return doc

    def _wait_ready(self) -> None:
        kubelet = self._procs["kubelet"]

        def ready() -> bool:
            if kubelet.poll() is not None:
                raise RealNodeError(
                    f"kubelet exited (rc={kubelet.returncode}); last lines of {self.log('kubelet')}:\n"
                    f"{_tail(self.log('kubelet'))}"
                )
            node = self._kubectl_json("get", "node", self.name)
            if node is None:
                return False
            conds = {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}
            return bool(conds.get("Ready", {}).get("status") == "True")

        try:
            poll(ready, timeout=self.spec.ready_timeout, interval=0.25, what=f"node {self.name} Ready")
        except TimeoutError as exc:
            node = self._kubectl_json("get", "node", self.name)
            conds = (node or {}).get("status", {}).get("conditions") if node else "node not registered"
            raise RealNodeError(
                f"{exc}; conditions: {conds}\n--- kubelet log tail:\n{_tail(self.log('kubelet'))}\n"
                f"--- containerd log tail:\n{_tail(self.log('containerd'))}"
            ) from exc

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again with the same flags (it wipes the device-plugin sockets as it
        starts, as on a real node); wait until the Node is Ready again. Running containers keep running."""
        self._terminate("kubelet")
        self._spawn("kubelet", self._cmds["kubelet"])
        self._wait_ready()

    # ---------------------------------------------------------------- stop
    def _shim_pids(self) -> list[int]:
        sock = str(self.containerd_socket)
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                cmd = _cmdline(int(entry.name))
                if cmd and cmd[0].endswith("containerd-shim-runc-v2") and sock in cmd:
                    out.append(int(entry.name))
        return out

    def stop(self) -> None:
        """Kubelet, then every container, then shims and containerd; unmount, remove the bridge, unlock."""
        if self._stopped:
            return
        self._stopped = True
        if self._lock is None:
            # Never got the machine: the cgroups, netns, bridge and device-plugin files may be another node's.
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        self._terminate("kubelet")
        shims = self._shim_pids()
        children = _proc_children()
        containers = [pid for shim in shims for pid in _descendants(shim, children)]
        _kill(containers, signal.SIGKILL)
        _wait_gone(containers, 5)
        self._terminate("containerd")
        _kill(shims, signal.SIGKILL)
        self._stop_kube_proxy()
        _wait_gone(shims, 5)
        for mountpoint in reversed(_mounts_under([self.run_dir])):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True, check=False)
        if os.path.isdir("/run/netns"):
            for ns in sorted(set(os.listdir("/run/netns")) - self._netns_before):
                if ns.startswith("cni-"):
                    subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", self.spec.bridge], capture_output=True, check=False)
        _remove_kubelet_chains(_kubelet_chains() - self._kubelet_chains_before)
        self._remove_pod_cgroups()
        # The kubelet's checkpoint of device allocations would be restored by the next test bed kubelet.
        with contextlib.suppress(OSError):
            (DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").unlink()
        with contextlib.suppress(OSError):
            KUBELET_SOCKET.unlink()
        if STANDARD_POD_RESOURCES.is_symlink() and str(os.readlink(STANDARD_POD_RESOURCES)).startswith(
            str(self.run_dir)
        ):
            STANDARD_POD_RESOURCES.unlink()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
        self._lock = None
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _stop_kube_proxy(self) -> None:
        if "kube-proxy" not in self._procs:
            return
        self._terminate("kube-proxy")
        binary = self._kube_proxy_binary
        if binary is not None:
            with self.log("kube-proxy").open("ab") as log:
                subprocess.run(
                    [str(binary), "--cleanup", "--v=1"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=60,
                    check=False,
                )

    def _terminate(self, name: str, grace: float = 10.0) -> None:
        """SIGTERM one of our processes, SIGKILL it if it outlives ``grace`` seconds."""
        proc = self._procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    @staticmethod
    def _remove_pod_cgroups() -> None:
        """rmdir the (now empty) ``kubepods`` cgroup trees the kubelet made, deepest first."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            root = hierarchy / "kubepods"
            if not root.is_dir():
                continue
            dirs = sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            )
            for d in [*dirs, root]:
                with contextlib.suppress(OSError):
                    d.rmdir()

    def copy_logs(self, target: Path) -> None:
        """Keep kubelet and containerd logs (the run directory is removed on stop)."""
        if self.logs_dir.is_dir():
            shutil.copytree(self.logs_dir, target, dirs_exist_ok=True)

    def __enter__(self) -> RealNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
"""iptables chains the kubelet itself creates (its localnet firewall and canaries); kube-proxy --cleanup
leaves them."""


def _kubelet_chains() -> set[tuple[str, str]]:
    """(table, chain) of the kubelet's chains present now; empty where iptables is missing."""
    found: set[tuple[str, str]] = set()
    for table in ("filter", "nat", "mangle"):
        try:
            out = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False)
        except OSError:
            return set()
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "-N" and parts[1] in KUBELET_CHAINS:
                found.add((table, parts[1]))
    return found


def _remove_kubelet_chains(chains: set[tuple[str, str]]) -> None:
    """Unhook, flush and delete the chains this node's kubelet created (none that existed before it)."""
    for table, chain in sorted(chains):
        for hook in ("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"):
            while (
                subprocess.run(
                    ["iptables", "-t", table, "-D", hook, "-j", chain], capture_output=True, check=False
                ).returncode
                == 0
            ):
                pass
        subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True, check=False)
    for table, chain in sorted(chains):
        subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True, check=False)
