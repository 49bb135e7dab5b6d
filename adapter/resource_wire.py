"""Wire format of `metrics.k8s.io/v1beta1` (k8s.io/metrics types): NodeMetrics, PodMetrics and their lists.

Why separate from `adapter.wire`: the resource metrics API has its own types and, above all, its own
quantity rules. metrics-server writes CPU in nanocores (`"7338891n"`, collapsing to `"5m"` or `"1"` when
exact) and memory in bytes as a BinarySI Quantity (`"14520Ki"`, `"123456789"`, `"512"`); kubectl and the HPA
round up (`MilliValue()`), so a sub-millicore pod reads as 1m, never 0 as prometheus-adapter's truncated
millicores make it. `window` is a Go `time.Duration` string (`"2m0s"`), times are RFC 3339 in UTC. Items
inside a list carry no `kind`/`apiVersion` (Go omits the empty TypeMeta); top-level objects do.
Pure functions of plain values; golden-file tests pin the bytes.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from adapter.wire import ListMeta, format_time

METRICS_GROUP = "metrics.k8s.io"
METRICS_VERSIONS = ("v1beta1",)
"""k8s.io/metrics defines v1alpha1 and v1beta1 only (kubectl HEAD also asks for v1, which no server has)."""
GROUP_VERSION = f"{METRICS_GROUP}/v1beta1"

_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_UINT64_MAX = 2**64 - 1


def nanocores(cores: float) -> int:
    """Cores as whole nanocores (half up), clamped to what metrics-server's uint64 can hold."""
    return max(0, min(int(cores * 1e9 + 0.5), _UINT64_MAX))


def whole_bytes(value: float) -> int:
    """Bytes as a whole number (half up); metrics-server reports integral bytes."""
    return max(0, min(int(value + 0.5), _UINT64_MAX))


def decimal_quantity(mantissa: int, exponent: int) -> str:
    """Canonical DecimalSI Quantity of `mantissa` x 10^`exponent` (exponent a multiple of 3, >= -9)."""
    if mantissa == 0:
        return "0"
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa //= 1000
        exponent += 3
    return f"{mantissa}{_DECIMAL_SUFFIXES[exponent]}"


def cpu_quantity(cores: float) -> str:
    """CPU as metrics-server writes it: `uint64Quantity(nanocores, DecimalSI, -9)`."""
    return decimal_quantity(nanocores(cores), -9)


def memory_quantity(value: float) -> str:
    """Memory as metrics-server writes it: whole bytes as BinarySI (below 1024 DecimalSI, as apimachinery)."""
    n = whole_bytes(value)
    if n < 1024:
        return decimal_quantity(n, 0)
    power = 0
    while n % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
        n //= 1024
        power += 1
    return f"{n}{_BINARY_SUFFIXES[power]}"


def go_duration(seconds: float) -> str:
    """Go's `time.Duration.String()` for whole milliseconds: `0s`, `30s`, `2m0s`, `1h0m0s`, `1.5s`."""
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    secs = f"{whole}.{frac:03d}".rstrip("0") if frac else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


class ObjectMeta(TypedDict):
    """The part of metav1.ObjectMeta metrics-server fills (in Go's field order)."""

    name: str
    namespace: NotRequired[str]
    creationTimestamp: NotRequired[str]
    labels: NotRequired[dict[str, str]]


class ResourceList(TypedDict):
    cpu: str
    memory: str


class NodeMetrics(TypedDict):
    kind: NotRequired[Literal["NodeMetrics"]]
    apiVersion: NotRequired[str]
    metadata: ObjectMeta
    timestamp: str
    window: str
    usage: ResourceList


class ContainerMetrics(TypedDict):
    name: str
    usage: ResourceList


class PodMetrics(TypedDict):
    kind: NotRequired[Literal["PodMetrics"]]
    apiVersion: NotRequired[str]
    metadata: ObjectMeta
    timestamp: str
    window: str
    containers: list[ContainerMetrics]


class NodeMetricsList(TypedDict):
    kind: Literal["NodeMetricsList"]
    apiVersion: str
    metadata: ListMeta
    items: list[NodeMetrics]


class PodMetricsList(TypedDict):
    kind: Literal["PodMetricsList"]
    apiVersion: str
    metadata: ListMeta
    items: list[PodMetrics]


def usage(cpu_cores: float, memory_bytes: float) -> ResourceList:
    return {"cpu": cpu_quantity(cpu_cores), "memory": memory_quantity(memory_bytes)}


def object_meta(name: str, namespace: str, labels: dict[str, str], created: float) -> ObjectMeta:
    meta = ObjectMeta(name=name, namespace=namespace) if namespace else ObjectMeta(name=name)
    meta["creationTimestamp"] = format_time(created)
    if labels:
        meta["labels"] = labels
    return meta


def node_metrics(meta: ObjectMeta, timestamp: float, window: float, cpu: float, memory: float) -> NodeMetrics:
    """One list item (no kind/apiVersion); `top_level` adds them."""
    return NodeMetrics(
        metadata=meta, timestamp=format_time(timestamp), window=go_duration(window), usage=usage(cpu, memory)
    )


def pod_metrics(
    meta: ObjectMeta, timestamp: float, window: float, containers: list[tuple[str, float, float]]
) -> PodMetrics:
    """One list item from [(container, cpu cores, memory bytes)], in the given order."""
    return PodMetrics(
        metadata=meta,
        timestamp=format_time(timestamp),
        window=go_duration(window),
        containers=[ContainerMetrics(name=n, usage=usage(c, m)) for n, c, m in containers],
    )


def top_level_node(item: NodeMetrics) -> NodeMetrics:
    return {"kind": "NodeMetrics", "apiVersion": GROUP_VERSION, **item}


def top_level_pod(item: PodMetrics) -> PodMetrics:
    return {"kind": "PodMetrics", "apiVersion": GROUP_VERSION, **item}


def node_metrics_list(items: list[NodeMetrics]) -> NodeMetricsList:
    return {"kind": "NodeMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}


def pod_metrics_list(items: list[PodMetrics]) -> PodMetricsList:
    return {"kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}


def api_resource_list() -> dict[str, object]:
    """Discovery of `metrics.k8s.io/v1beta1`, as metrics-server serves it (singularName "" on purpose)."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": "nodes",
                "singularName": "",
                "namespaced": False,
                "kind": "NodeMetrics",
                "verbs": ["get", "list"],
            },
            {
                "name": "pods",
                "singularName": "",
                "namespaced": True,
                "kind": "PodMetrics",
                "verbs": ["get", "list"],
            },
        ],
    }
