"""Prometheus text exposition of the simulated fleet, in dcgm-exporter's exact names, types, HELP and labels.

Why it exists: one process must expose 5,000 nodes x 8 GPUs (~800k lines), so rendering is its own concern
and is written for speed: every GPU's label string is built once and reused until the pod holding the GPU
changes; each family is rendered with C-level `map`/`join` over per-GPU value lists, never per-line Python
formatting. It reads `Fleet` state and never changes it.

Label layout follows dcgm-exporter's template (`gpuMetricsFormat`): `gpu`, `UUID`, `pci_bus_id`, `device`,
`modelName`, `Hostname` (or `hostname`), then label fields (`DCGM_FI_DRIVER_VERSION`) and attributes in sorted
key order: `container`, `err_code`, `err_msg`, `namespace`, `pod`, `window_size_in_ms`, `xid`. Values are
formatted as the exporter does: integers with `%d`, doubles with `%f`.

Behaviours copied from the exporter on purpose (see the GPU-health reference, section 1.3): a GPU that never
had an XID has no DCGM_FI_DEV_XID_ERRORS series (blank values are skipped; `xid_zero_when_none` emulates older
exporters); the last XID sticks until a GPU reset; DCGM_EXP_XID_ERRORS_COUNT has one series per XID seen in
the window, or one 0-valued series without `xid`, and is typed `counter` as in the exporter's CSV although it
falls when XIDs age out of the window.

Shared GPUs, as dcgm-exporter shows them (reference/gpu-sharing.md, section 4): a MIG GPU has one series per
GPU instance (`GPU_I_PROFILE`, `GPU_I_ID` after `modelName`; `UUID`, `gpu`, `device` the parent's), no
DCGM_FI_DEV_GPU_UTIL, GPU-level fields repeated on every instance and XIDs on the instance they are
attributed to. A time-sliced GPU has one series attributed to one of its pods (the last one mapped). With
`exporter.virtual_gpus` every series of a device a pod holds is copied once per pod (`vgpu=<replica>` for a
replica), except DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED: the device series stays, plus one series per
pod with its own processes' value and `pod_uid`. Series of GPUs no pod holds stay as they are.
"""

from __future__ import annotations

import operator
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.simulator.engine import TTFT_BUCKETS, EngineState
from harness.simulator.fleet import Fleet
from harness.simulator.hardware import Gpu, MigInstance
from harness.simulator.workload import Pod

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# dcgm-exporter internal/pkg/collector/xid_errors.go; index = XID code.
_XID_TEXT = {
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    46: "GPU stopped processing",
    48: "Double Bit ECC Error",
    54: "Auxiliary power is not connected to the GPU board",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    93: "Non-fatal violation of provisioned InfoROM wear limit",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    136: "ALI Training Fail",
    137: "NVLink Privilege Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    144: "NVLINK: Saw Error",
    145: "NVLINK: RLW Error",
    146: "NVLINK: TLW Error",
    147: "NVLINK: TREX Error",
    148: "NVLINK: NVLPW_CTRL Error",
    149: "NVLINK: NETIR Error",
    150: "NVLINK: MSE Error",
    151: "Robust Channel Key rotation Error",
    154: "GPU Recovery Action Changed",
    155: "NVLINK: SW Defined Error",
    156: "Resource Retirement Event",
    157: "Resource Retirement Failure",
    158: "GPU Fatal Timeout",
    159: "Robust Channel CHI Non-Data Error",
    160: "Channel Retirement Event",
    161: "Channel Retirement Failure",
    171: "Uncorrectable DRAM Error",
    172: "Uncorrectable SRAM Error",
}


def xid_message(code: int) -> str:
    """The `err_msg` dcgm-exporter attaches to an XID code.

    The simulator carries the exporter's text for the XIDs health rules care about (above); any other code
    gets the exporter's own fallback, "Unknown Error".
    """
    return "No Error" if code == 0 else _XID_TEXT.get(code, "Unknown Error")


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    help: str

    @property
    def header(self) -> str:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.type}\n"


Values = Callable[[list[Any]], Iterable[str]]
"""Per series, the value text, from a GPU, a MIG instance or a pod's share of either (`_PodShare`)."""


def _ints(attr: str) -> Values:
    get = operator.attrgetter(attr)
    return lambda gpus: map(str, map(get, gpus))


def _util(gpus: list[Gpu]) -> Iterable[str]:
    return [str(round(g.util)) for g in gpus]


def _gr_active(gpus: list[Gpu]) -> Iterable[str]:
    return [f"{g.util * 0.0095:f}" for g in gpus]  # ratio; a little below util/100, as on real GPUs


def _power(gpus: list[Gpu]) -> Iterable[str]:
    return [f"{g.power_w:f}" for g in gpus]


def _energy(gpus: list[Gpu]) -> Iterable[str]:
    return [str(int(g.energy_mj)) for g in gpus]


XID = Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
XID_COUNT = Family("DCGM_EXP_XID_ERRORS_COUNT", "counter", "reported XIDs during last window")
HTTP_REQUESTS = Family("http_requests_total", "counter", "Total HTTP requests served by the pod (simulated).")
GATEWAY_REQUESTS = Family(
    "gateway_requests_total",
    "counter",
    "Total requests the gateway received for the service, whether or not a pod serves it (simulated).",
)
CONTAINER_CPU = Family(
    "container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds."
)
CONTAINER_MEMORY = Family(
    "container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes."
)

# One series per exported GPU; order as in dcgm-exporter's etc/dcp-metrics-included.csv.
PER_GPU: tuple[tuple[Family, Values], ...] = (
    (Family("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."), _ints("mem_temp_c")),
    (Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."), _ints("temp_c")),
    (Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."), _power),
    (
        Family(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."
        ),
        _energy,
    ),
    (Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."), _util),
    (Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."), _ints("fb_free_mib")),
    (Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."), _ints("fb_used_mib")),
    (
        Family("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
        _ints("ecc_sbe_vol"),
    ),
    (
        Family("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
        _ints("ecc_dbe_vol"),
    ),
    (
        Family(
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."
        ),
        _ints("ecc_sbe_agg"),
    ),
    (
        Family(
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."
        ),
        _ints("ecc_dbe_agg"),
    ),
    (
        Family(
            "DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."
        ),
        _ints("retired_sbe"),
    ),
    (
        Family(
            "DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."
        ),
        _ints("retired_dbe"),
    ),
    (
        Family("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."),
        _ints("retired_pending"),
    ),
    (
        Family(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "counter",
            "Number of remapped rows for uncorrectable errors",
        ),
        _ints("remapped_uncorrectable"),
    ),
    (
        Family(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "counter",
            "Number of remapped rows for correctable errors",
        ),
        _ints("remapped_correctable"),
    ),
    (
        Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
        _ints("row_remap_failure"),
    ),
    (
        Family("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
        _gr_active,
    ),
)


def _margin(gpus: list[Gpu]) -> Iterable[str]:
    return [f"{g.margin_c if g.margin_override is None else g.margin_override:g}" for g in gpus]


def _flit(gpus: list[Gpu]) -> Iterable[str]:
    return [str(int(g.nvlink_crc_flit)) for g in gpus]


def _zeros(gpus: list[Gpu]) -> Iterable[str]:
    return ["0"] * len(gpus)


# Fabric and degradation signals (health.signals); the fields are DCGM's, the help texts dcgm-exporter's or
# dcgm_fields.h's. NVLink counters only on an NVLink board (a PCIe-only card has no such series).
SIGNAL_FAMILIES: tuple[tuple[Family, Values], ...] = (
    (Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
     lambda gpus: [str(int(g.pcie_replays)) for g in gpus]),
    (Family("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
     _ints("clock_reasons")),
    (Family("DCGM_FI_DEV_GPU_TEMP_LIMIT", "gauge", "Thermal margin temperature (distance to nearest "
            "slowdown threshold)."), _margin),
    (Family("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "gauge", "The status of the fabric manager."),
     _ints("fm_status")),
    (Family("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE", "gauge", "The failure that happened while starting the "
            "Fabric Manager, if any."), _ints("fm_error")),
    (Family("DCGM_FI_DEV_FABRIC_HEALTH_MASK", "gauge", "GPU Fabric health Status Mask."),
     _ints("fabric_mask")),
)  # fmt: skip
NVLINK_FAMILIES: tuple[tuple[Family, Values], ...] = (
    (Family("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
            "Total number of NVLink flow-control CRC errors."), _flit),
    (Family("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
            "Total number of NVLink data CRC errors."), _zeros),
    (Family("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
     _zeros),
    (Family("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
            "Total number of NVLink recovery errors."), _zeros),
)  # fmt: skip
NVSWITCH_FATAL = Family("DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", "gauge", "NVSwitch fatal errors (last SXid).")
NVSWITCH_NON_FATAL = Family(
    "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS", "gauge", "NVSwitch non-fatal errors (last SXid)."
)
NVSWITCHES_PER_NODE = 4  # HGX H100 8-GPU board
ALL_FAMILIES = (
    *(f.name for f, _ in (*PER_GPU, *SIGNAL_FAMILIES, *NVLINK_FAMILIES)),
    XID.name,
    XID_COUNT.name,
)


@dataclass(frozen=True)
class _Labels:
    pod: Pod | None
    base: str  # '{gpu=...,DCGM_FI_DRIVER_VERSION="..."' (open)
    container: str  # ',container="..."' or ''
    ns_pod: str  # ',namespace="...",pod="..."[,pod_uid="..."][,vgpu="..."]' or ''
    open: str  # base + container + ns_pod
    closed: str  # open + '} '


GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
PER_PROCESS = (GPU_UTIL, FB_USED)
"""Fields dcgm-exporter (since 4.5.3-4.8.2) splits per pod from NVML's per-process data (virtual GPUs)."""
_POD_UID_NAMESPACE = uuid.UUID("0c8e4a52-7d0f-4f55-a3a4-1d2e5b6f7a80")


def pod_uid(pod: Pod) -> str:
    """A stable stand-in for the pod's metadata.uid (`pod_uid` label)."""
    return str(uuid.uuid5(_POD_UID_NAMESPACE, f"{pod.namespace}/{pod.name}"))


@dataclass(eq=False)
class _PodShare:
    """One pod's own value of a per-process field on a device (GPU or MIG instance)."""

    util: float
    fb_used_mib: int


@dataclass(frozen=True)
class _Row:
    """One series of a device: `src` the GPU or instance (health, XIDs), `value` what values are read
    from (`src`, or a pod's share for per-process fields)."""

    src: Gpu | MigInstance
    value: Any
    labels: _Labels


@dataclass(eq=False)
class Chunk:
    """A rendered piece of the body; `gz` is its raw deflate once a gzip client asked (compression.py)."""

    data: bytes
    labels: list[str] | None = None
    values: list[str] | None = None
    gz: bytes | None = None


class Renderer:
    """Renders a fleet; reuses per-GPU label strings and unchanged blocks of lines between renders.

    The whole-fleet body is cut into chunks of `BLOCK` GPUs per family. A chunk whose labels and values are
    unchanged since the last render is reused as is (bytes and compressed bytes), so a step in which only
    busy GPUs change re-renders and re-compresses only their blocks.
    """

    BLOCK = 256

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        ex = fleet.scenario.exporter
        self._hostname = ex.hostname_label
        self._k8s = ex.kubernetes
        self._cadvisor = ex.cadvisor
        self._virtual = ex.virtual_gpus
        self._any_shared = any(g.shared for n in fleet.nodes.values() for g in n.gpus)
        switch_names = {NVSWITCH_FATAL.name, NVSWITCH_NON_FATAL.name}
        enabled = set(ex.metrics) if ex.metrics is not None else {*ALL_FAMILIES, *switch_names}
        nvlink = fleet.model.nvlink
        known = (*PER_GPU, *SIGNAL_FAMILIES, *(NVLINK_FAMILIES if nvlink else ()))
        self._families = [(f, v) for f, v in known if f.name in enabled]
        self._switches = [f for f in (NVSWITCH_FATAL, NVSWITCH_NON_FATAL) if nvlink and f.name in enabled]
        self._xid = XID.name in enabled
        self._xid_count = XID_COUNT.name in enabled
        self._window = f',window_size_in_ms="{round(ex.xid_count_window * 1000)}"'
        self._model = escape(fleet.model.model_name)
        self._driver = escape(fleet.model.driver_version)
        self._labels: dict[Gpu, _Labels] = {}
        self._chunks: dict[tuple[str, int], Chunk] = {}
        self._headers = {
            f.name: Chunk(f.header.encode())
            for f in (*(f for f, _ in (*PER_GPU, *SIGNAL_FAMILIES, *NVLINK_FAMILIES)), XID, XID_COUNT)
        }

    def _label(self, g: Gpu) -> _Labels:
        cached = self._labels.get(g)
        if cached is not None and cached.pod is g.pod:
            return cached
        base = (
            f'{{gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",device="nvidia{g.index}",'
            f'modelName="{self._model}",{self._hostname}="{escape(g.node)}",DCGM_FI_DRIVER_VERSION="{self._driver}"'
        )
        p = g.pod if self._k8s else None
        container = f',container="{escape(p.container)}"' if p else ""
        ns_pod = f',namespace="{escape(p.namespace)}",pod="{escape(p.name)}"' if p else ""
        opened = base + container + ns_pod
        made = self._labels[g] = _Labels(g.pod, base, container, ns_pod, opened, opened + "} ")
        return made

    def _shared_label(
        self, src: Gpu | MigInstance, pod: Pod | None, *, vgpu: int | None = None, uid: bool = False
    ) -> _Labels:
        """Labels of a MIG instance's series or of a per-pod copy (built per render: few, and they change
        whenever the pods do)."""
        g = src.gpu if isinstance(src, MigInstance) else src
        mig = f',GPU_I_PROFILE="{src.profile}",GPU_I_ID="{src.gi_id}"' if isinstance(src, MigInstance) else ""
        base = (
            f'{{gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",device="nvidia{g.index}",'
            f'modelName="{self._model}"{mig},{self._hostname}="{escape(g.node)}",'
            f'DCGM_FI_DRIVER_VERSION="{self._driver}"'
        )
        p = pod if self._k8s else None
        container = f',container="{escape(p.container)}"' if p else ""
        ns_pod = f',namespace="{escape(p.namespace)}",pod="{escape(p.name)}"' if p else ""
        if p and uid:
            ns_pod += f',pod_uid="{pod_uid(p)}"'
        if p and vgpu is not None:
            ns_pod += f',vgpu="{vgpu}"'
        opened = base + container + ns_pod
        return _Labels(p, base, container, ns_pod, opened, opened + "} ")

    def _holders(self, src: Gpu | MigInstance) -> list[tuple[int | None, Pod]]:
        """(replica or None, pod) for every device ID of `src` a pod holds, in mapping order."""
        if isinstance(src, MigInstance):
            return [(None, src.pod)] if src.pod is not None else []
        if src.replicas > 1:
            return [(n, p) for n, p in src.holders]
        return [(None, src.pod)] if src.pod is not None else []

    def _rows(self, gpus: list[Gpu]) -> tuple[list[_Row], list[_Row], list[_Row]]:
        """The series of `gpus`: (most families, DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED)."""
        base: list[_Row] = []
        util: list[_Row] = []
        fb: list[_Row] = []
        for g in gpus:
            entities: list[Gpu | MigInstance] = list(g.instances) if g.instances else [g]
            for src in entities:
                holders = self._holders(src) if self._virtual and self._k8s else []
                if not holders:
                    lab = self._label(g) if src is g else self._shared_label(src, src.pod)
                    row = _Row(src, src, lab)
                    base.append(row)
                    if src is g:
                        util.append(row)
                    fb.append(row)
                    continue
                for vgpu, pod in holders:
                    base.append(_Row(src, src, self._shared_label(src, pod, vgpu=vgpu)))
                device = _Row(src, src, self._shared_label(src, None))
                shares = [self._share(src, pod) for _, pod in holders]
                per_pod = [
                    _Row(src, share, self._shared_label(src, pod, vgpu=vgpu, uid=True))
                    for (vgpu, pod), share in zip(holders, shares, strict=True)
                ]
                if src is g:
                    util += [device, *per_pod]
                fb += [device, *per_pod]
        return base, util, fb

    def _share(self, src: Gpu | MigInstance, pod: Pod) -> _PodShare:
        """`pod`'s own part of `src`'s utilization and framebuffer (its processes', per NVML)."""
        if isinstance(src, MigInstance) or src.replicas <= 1:
            return _PodShare(src.util, src.fb_used_mib)
        memory = min(pod.workload.memory_mib_per_gpu * pod.gpus.count(src.index), src.fb_used_mib)
        return _PodShare(self.fleet.pod_share(src, pod), memory)

    def exported_gpus(self, node: str | None = None) -> list[Gpu]:
        nodes = self.fleet.nodes.values() if node is None else [self.fleet.nodes[node]]
        return [g for n in nodes if n.exporter_up for g in n.gpus if g.present]

    def _family(self, name: str, labels: list[str], values: list[str], cache: bool) -> list[Chunk]:
        """`name + label + value` lines; with `cache`, blocks equal to last render's are reused."""
        sep = "\n" + name
        out = []
        for b in range(0, len(labels), self.BLOCK):
            lab, val = labels[b : b + self.BLOCK], values[b : b + self.BLOCK]
            old = self._chunks.get((name, b)) if cache else None
            if old is not None and old.values == val and old.labels == lab:
                out.append(old)
                continue
            chunk = Chunk((name + sep.join(map(operator.add, lab, val)) + "\n").encode(), lab, val)
            if cache:
                self._chunks[(name, b)] = chunk
            out.append(chunk)
        return out

    def render_dcgm(self, gpus: list[Gpu], *, cache: bool = False) -> list[Chunk]:
        """Chunks of every enabled DCGM family for `gpus`; `cache` only for the one whole-fleet body."""
        if not gpus:
            return []
        if not self._any_shared and not self._virtual:
            labels = [self._label(g) for g in gpus]
            rows = [_Row(g, g, lab) for g, lab in zip(gpus, labels, strict=True)]
            by_family = {GPU_UTIL: rows, FB_USED: rows}
        else:
            rows, util_rows, fb_rows = self._rows(gpus)
            labels = [r.labels for r in rows]
            by_family = {GPU_UTIL: util_rows, FB_USED: fb_rows}
        closed = [lab.closed for lab in labels]
        srcs: list[Any] = [r.src for r in rows]
        out: list[Chunk] = []
        for fam, values in self._families:
            own = by_family.get(fam.name)
            if own is None or own is rows:
                out.append(self._headers[fam.name])
                out += self._family(fam.name, closed, list(values(srcs)), cache)
            elif own:
                out.append(self._headers[fam.name])
                out += self._family(
                    fam.name, [r.labels.closed for r in own], list(values([r.value for r in own])), cache
                )
        if self._xid:
            lines = self._xid_lines(srcs, labels)
            if lines:
                out += (self._headers[XID.name], Chunk(("\n".join(lines) + "\n").encode()))
        if self._xid_count:
            out.append(self._headers[XID_COUNT.name])
            out += self._family(
                XID_COUNT.name, [lab.open for lab in labels], self._xid_count_suffixes(srcs, labels), cache
            )
        out += self._switch_chunks(gpus)
        return out

    def _switch_chunks(self, gpus: list[Gpu]) -> list[Chunk]:
        """NVSwitch series (dcgm-exporter's switch template: `nvswitch`, hostname, no UUID), per node."""
        if not self._switches:
            return []
        nodes = list(dict.fromkeys(g.node for g in gpus))
        out = []
        for fam in self._switches:
            fatal = fam is NVSWITCH_FATAL
            lines = []
            for name in nodes:
                sxids = self.fleet.nodes[name].nvswitch_sxid
                for sw in range(NVSWITCHES_PER_NODE):
                    sxid, is_fatal = sxids.get(sw, (0, fatal))
                    value = sxid if is_fatal == fatal else 0
                    lines.append(f'{fam.name}{{nvswitch="{sw}",{self._hostname}="{escape(name)}"}} {value}')
            out.append(Chunk((fam.header + "\n".join(lines) + "\n").encode()))
        return out

    def _xid_lines(self, gpus: list[Gpu | MigInstance], labels: list[_Labels]) -> list[str]:
        zero = self.fleet.scenario.exporter.xid_zero_when_none
        lines = []
        for g, lab in zip(gpus, labels, strict=True):
            code = g.last_xid if g.last_xid is not None else (0 if zero else None)
            if code is not None:
                lines.append(
                    f'{XID.name}{lab.base}{lab.container},err_code="{code}",'
                    f'err_msg="{escape(xid_message(code))}"{lab.ns_pod}}} {code}'
                )
        return lines

    def _xid_count_suffixes(self, gpus: list[Gpu | MigInstance], labels: list[_Labels]) -> list[str]:
        """Per GPU: the rest of its DCGM_EXP_XID_ERRORS_COUNT line(s) after the open label set."""
        with_events = self.fleet.xid_gpus
        zero = self._window + "} 0"
        out = []
        for g, lab in zip(gpus, labels, strict=True):
            if g not in with_events:
                out.append(zero)
                continue
            counts = sorted(Counter(code for _, code in g.xid_events).items())
            more = "\n" + XID_COUNT.name + lab.open
            out.append(more.join(f'{self._window},xid="{code}"}} {n}' for code, n in counts))
        return out

    def render_apps(self) -> list[Chunk]:
        """http_requests_total for every pod serving a workload (as the pods' own /metrics would); with
        `exporter.cadvisor`, also its container's cAdvisor CPU and memory (as the kubelet's would)."""
        pods = sorted(self.fleet.pods.values(), key=lambda p: (p.namespace, p.name))
        if not pods:
            return []
        lines = [
            f'{HTTP_REQUESTS.name}{{code="200",method="GET",namespace="{escape(p.namespace)}",'
            f'pod="{escape(p.name)}"}} {int(p.requests)}'
            for p in pods
        ]
        out = [Chunk(HTTP_REQUESTS.header.encode()), Chunk(("\n".join(lines) + "\n").encode())]
        if self._cadvisor:
            labels = [
                f'{{container="{escape(p.container)}",namespace="{escape(p.namespace)}",node="{escape(p.node)}",'
                f'pod="{escape(p.name)}"}}'
                for p in pods
            ]
            cpu = [
                f"{CONTAINER_CPU.name}{lab} {p.cpu_seconds:.6f}" for p, lab in zip(pods, labels, strict=True)
            ]
            mem = [
                f"{CONTAINER_MEMORY.name}{lab} {p.memory_bytes}" for p, lab in zip(pods, labels, strict=True)
            ]
            for family, body in ((CONTAINER_CPU, cpu), (CONTAINER_MEMORY, mem)):
                out += [Chunk(family.header.encode()), Chunk(("\n".join(body) + "\n").encode())]
        return out

    def render_gateway(self) -> list[Chunk]:
        """gateway_requests_total{namespace, service} for every workload with a gateway (as an ingress or
        inference gateway in front of it would count them): present, and moving with the load, while the
        workload runs no pod at all."""
        served = sorted(
            (w for w in self.fleet.workloads.values() if w.gateway), key=lambda w: (w.namespace, w.name)
        )
        if not served:
            return []
        lines = [
            f'{GATEWAY_REQUESTS.name}{{namespace="{escape(w.namespace)}",service="{escape(w.name)}"}} '
            f"{int(w.gateway_requests)}"
            for w in served
        ]
        return [Chunk(GATEWAY_REQUESTS.header.encode()), Chunk(("\n".join(lines) + "\n").encode())]

    def render_engines(self) -> list[Chunk]:
        """The serving engine's series of every pod of a workload with an engine (vLLM V1- or TGI-shaped,
        with the `namespace` / `pod` labels Prometheus' Kubernetes discovery attaches), and each such
        workload's `router_queue_depth{namespace, service}`, present while no pod runs."""
        served = sorted(
            (w for w in self.fleet.workloads.values() if w.engines is not None),
            key=lambda w: (w.namespace, w.name),
        )
        families: dict[tuple[str, str], list[str]] = {}  # (family, type) -> its lines, kept together
        for w in served:
            engines = w.engines
            assert engines is not None
            for pod, state in sorted(engines.pods.items()):
                where = f'namespace="{escape(w.namespace)}",pod="{escape(pod)}"'
                for family, kind, line in _engine_lines(engines.kind, engines.model, where, state):
                    families.setdefault((family, kind), []).append(line)
        lines: list[str] = []
        for (family, kind), body in families.items():
            lines += [f"# TYPE {family} {kind}", *body]
        if served:
            lines.append(f"# HELP {ROUTER_QUEUE} Requests the router holds for a backend (simulated).")
            lines.append(f"# TYPE {ROUTER_QUEUE} gauge")
            for w in served:
                assert w.engines is not None
                lines.append(
                    f'{ROUTER_QUEUE}{{namespace="{escape(w.namespace)}",service="{escape(w.name)}"}} '
                    f"{w.engines.router.waiting:.3f}"
                )
        return [Chunk(("\n".join(lines) + "\n").encode())] if lines else []

    def render_chunks(self, *, node: str | None = None, dcgm: bool = True, apps: bool = True) -> list[Chunk]:
        """The whole fleet (default, block-cached), one node's exporter (`node`), or only app metrics (the
        pods' and the gateway's)."""
        chunks = self.render_dcgm(self.exported_gpus(node), cache=node is None) if dcgm else []
        if apps:
            chunks += self.render_apps() + self.render_gateway() + self.render_engines()
        return chunks

    def render(self, *, node: str | None = None, dcgm: bool = True, apps: bool = True) -> str:
        """The exposition as text (tests and tools; the server serves `render_chunks`)."""
        return b"".join(c.data for c in self.render_chunks(node=node, dcgm=dcgm, apps=apps)).decode()


ROUTER_QUEUE = "router_queue_depth"
"""The router's queue per workload: the adapter's `router_queue` preset reads it by this default name."""


def _histogram(
    name: str, where: str, bounds: tuple[float, ...], counts: list[float], total: float, n: float
) -> list[tuple[str, str, str]]:
    out = [
        (name, "histogram", f'{name}_bucket{{{where},le="{le:g}"}} {c:.3f}')
        for le, c in zip(bounds, counts, strict=True)
    ]
    out.append((name, "histogram", f'{name}_bucket{{{where},le="+Inf"}} {n:.3f}'))
    out.append((name, "histogram", f"{name}_sum{{{where}}} {total:.3f}"))
    out.append((name, "histogram", f"{name}_count{{{where}}} {n:.3f}"))
    return out


def _engine_lines(kind: str, model: str, where: str, s: EngineState) -> list[tuple[str, str, str]]:
    """(family, type, line) of one pod's engine series, as vLLM's V1 engine (labels `engine`,
    `model_name`) or TGI (none) name them: docs.vllm.ai "Metrics";
    huggingface.co/docs/text-generation-inference/reference/metrics."""
    if kind == "vllm":
        at = f'engine="0",model_name="{escape(model)}",{where}'
        return [
            ("vllm:num_requests_waiting", "gauge", f"vllm:num_requests_waiting{{{at}}} {s.waiting:.3f}"),
            ("vllm:num_requests_running", "gauge", f"vllm:num_requests_running{{{at}}} {s.running:.3f}"),
            ("vllm:kv_cache_usage_perc", "gauge", f"vllm:kv_cache_usage_perc{{{at}}} {s.kv_cache:.4f}"),
            (
                "vllm:generation_tokens_total",
                "counter",
                f"vllm:generation_tokens_total{{{at}}} {s.generated_tokens:.1f}",
            ),
            *_histogram(
                "vllm:time_to_first_token_seconds", at, TTFT_BUCKETS, s.ttft_buckets, s.ttft_sum, s.ttft_count
            ),
        ]
    return [
        ("tgi_queue_size", "gauge", f"tgi_queue_size{{{where}}} {s.waiting:.3f}"),
        ("tgi_batch_current_size", "gauge", f"tgi_batch_current_size{{{where}}} {s.running:.3f}"),
        *_histogram("tgi_request_generated_tokens", where, (), [], s.generated_tokens, s.ttft_count),
    ]
