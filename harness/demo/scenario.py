"""The demo scenario file: a fleet, then a scripted timeline of steps with actions and expected outcomes.

Why it exists: `gpuwarden demo` must prove every capability with checks, not narrate it, and users must be
able to script their own runs (`gpuwarden demo --scenario FILE`). A step is "do these things, then expect
these outcomes within N seconds (and keep them for M seconds)"; every action and every expectation is a
one-key mapping (`- deploy: {...}`, `- quarantined: {...}`) so the YAML reads like the story it tells.
Unknown keys are errors naming their field, and every problem is reported at once (as for the config).

What it must not do: talk to anything. Running actions is `actions.py`, checking expectations `checks.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from gpuwarden.config.base import Section
from gpuwarden.errors import ConfigError
from harness.simulator.scenario import fault_adapter, problems_of

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "demo" / "default.yaml"
Seconds = float


class Pool(Section):
    """Nodes reserved for one kind of work: labelled `gpuwarden.io/pool=<name>` and tainted with that key."""

    nodes: list[str] = Field(min_length=1)
    taint: bool = Field(True, description="taint the nodes so only pods that tolerate the pool land there")


class Fleet(Section):
    """The kwok GPU nodes (and the simulator's view of them): same names, same GPUs, same NUMA split."""

    nodes: int = Field(16, ge=1, le=200)
    gpus_per_node: int = Field(8, ge=1, le=16)
    numa_nodes: int = Field(2, ge=1, le=8)
    node_name_pattern: str = "gpu-node-{index:02d}"
    pools: dict[str, Pool] = Field(default_factory=dict)

    def node_names(self) -> list[str]:
        return [self.node_name_pattern.format(index=i) for i in range(self.nodes)]

    def numa_of(self, gpu: int) -> int:
        """GPUs are split evenly and in order, as in the simulator (8 GPUs, 2 NUMA: 0-3 -> 0, 4-7 -> 1)."""
        return gpu * self.numa_nodes // self.gpus_per_node


ENGINE_METRICS = ("router_queue_depth", "vllm_workload_queue_depth", "vllm_workload_kv_cache_usage")
"""External metrics of a Deployment with a serving engine (the stack's adapter config serves them)."""
EXTERNAL_METRICS = ("gateway_requests_per_second", *ENGINE_METRICS)
"""Every External metric an `Hpa` can target, in the order its manifest lists them."""


class Hpa(Section):
    """An autoscaling/v2 HPA on the Deployment, with metrics served by the gpuwarden adapter: Pods metrics
    (custom.metrics.k8s.io), the gateway's request rate and, for a Deployment with a serving engine, the
    router's queue and the engine's queue and KV cache summed over the workload (External,
    external.metrics.k8s.io). Each field is named after the metric it targets."""

    min: int = Field(
        1,
        ge=0,
        description="minReplicas; 0 parks the Deployment at zero when idle (HPAScaleToZero: beta and on from "
        "Kubernetes 1.37), which needs every metric to be External: `gateway_requests_per_second`, "
        "`router_queue_depth`, `vllm_workload_queue_depth`, `vllm_workload_kv_cache_usage`",
    )
    max: int = Field(ge=1)
    gpu_utilization: float | None = Field(None, gt=0, description="target average GPU utilization (%)")
    requests_per_second: float | None = Field(None, gt=0, description="target average QPS per pod")
    gateway_requests_per_second: float | None = Field(
        None,
        gt=0,
        description="target requests per second per replica of the rate the gateway in front of the "
        "workload receives (External metric `gateway_requests_per_second{service=<name>}`, from the "
        "simulator's `gateway_requests_total`): it exists while no pod runs, so it can wake a Deployment "
        "parked at zero",
    )
    router_queue_depth: float | None = Field(
        None,
        gt=0,
        description="target requests waiting per replica at the router in front of a Deployment with an "
        "`engine` (External `router_queue_depth{service=<name>}`, the adapter's `router_queue` preset over "
        "the simulator's router gauge): the router holds requests while no pod runs, so it wakes the "
        "workload from zero",
    )
    vllm_workload_queue_depth: float | None = Field(
        None,
        gt=0,
        description="target requests waiting in the vLLM engines per replica (External: "
        "`vllm:num_requests_waiting` summed over the namespace's pods, 0 while none runs; per replica it "
        "is the average of the per-pod `vllm_queue_depth`, which as a Pods metric could not be read at zero)",
    )
    vllm_workload_kv_cache_usage: float | None = Field(
        None,
        gt=0,
        le=1,
        description="target KV-cache use (0-1) per replica (External: each pod's fullest cache, "
        "`vllm:kv_cache_usage_perc`, summed over the namespace's pods, 0 while none runs: per replica the "
        "average of the per-pod `vllm_kv_cache_usage`)",
    )
    scale_down_stabilization_seconds: int = Field(0, ge=0)

    @property
    def external_targets(self) -> dict[str, float]:
        """External metric name -> target average value per replica, for the metrics set."""
        return {n: v for n in EXTERNAL_METRICS if (v := getattr(self, n)) is not None}

    @property
    def engine_targets(self) -> list[str]:
        """The metrics set that only a Deployment with a serving engine has."""
        return [n for n in ENGINE_METRICS if getattr(self, n) is not None]

    @model_validator(mode="after")
    def _metrics_fit_the_bounds(self) -> Hpa:
        pods_metrics = [n for n in ("gpu_utilization", "requests_per_second") if getattr(self, n) is not None]
        if not pods_metrics and not self.external_targets:
            raise ValueError("give at least one metric target")
        if self.min == 0 and pods_metrics:
            raise ValueError(
                f"min 0 needs every metric to be External (a Pods metric has no pod to read at zero): "
                f"drop {', '.join(pods_metrics)} or set min >= 1"
            )
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Workload(Section):
    """Pods requesting GPUs; scheduled by kube-scheduler through the gpuwarden extender."""

    name: str
    namespace: str = "default"
    gpus: int = Field(1, ge=1)
    priority_class: str | None = None
    pool: str | None = Field(None, description="run only on this pool's nodes (tolerates its taint)")
    nodes: list[str] | None = Field(None, description="run only on these nodes (required node affinity)")
    prefer_nodes: list[str] | None = Field(
        None,
        description="prefer these nodes (preferred node affinity, weight 100): where the scheduler puts the "
        "first pods while every node is empty, which is otherwise a random pick among equals",
    )
    topology_policy: Literal["single-numa", "prefer-numa", "single-pcie", "none"] | None = None
    hold: bool = Field(
        False, description="add a finalizer so a deleted pod stays terminating (a job checkpointing)"
    )


class Deploy(Workload):
    """A Deployment; with `qps` the simulator serves that load over its pods (split evenly)."""

    replicas: int = Field(1, ge=0)
    qps: float | None = Field(None, ge=0)
    qps_per_gpu: float = Field(100.0, gt=0, description="QPS one GPU serves at 100 % utilization")
    engine: Literal["vllm"] | None = Field(
        None,
        description="the simulator serves a vLLM-shaped engine per pod (queue, running batch, KV cache, "
        "TTFT, tokens) and the router's queue in front of the workload (harness/simulator/engine.py); needs "
        "`qps`",
    )
    hpa: Hpa | None = None

    @model_validator(mode="after")
    def _engine_metrics_need_an_engine(self) -> Deploy:
        if self.engine is not None and self.qps is None:
            raise ValueError("`engine` needs `qps` (the load the engine serves; 0 for none yet)")
        if self.hpa is not None and self.engine is None and self.hpa.engine_targets:
            raise ValueError(f"{', '.join(self.hpa.engine_targets)} need `engine: vllm`")
        return self


class Job(Workload):
    """A training job: `parallelism` worker pods `<name>-worker-<i>` (bare pods, as training operators
    create them); a preempted worker is not recreated."""

    parallelism: int = Field(1, ge=1)


class Load(Section):
    """Change the QPS the simulator serves for a workload (split over its mapped pods)."""

    workload: str
    namespace: str = "default"
    qps: float = Field(ge=0)


class Selected(Section):
    """Pods of one workload (label `app=<workload>`)."""

    workload: str
    namespace: str = "default"


class Faults(Section):
    """Simulator faults (see harness/simulator/control.py), fanned out over `nodes` x `gpus`.

    Any other key (`kind`, `code`, `count`, `error`, `duration`, ...) is passed to the simulator as is and
    validated against its fault schema when the scenario is loaded.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    nodes: list[str] = Field(min_length=1)
    gpus: list[int] | None = Field(None, description="GPU indices; omitted: the fault has no `gpu`")
    gpus_of: Selected | None = Field(
        None,
        description="instead of `gpus`: on each node, the GPUs held by the workload's first pod there (by "
        "name), resolved when the fault is injected; no such pod fails the action",
    )

    @model_validator(mode="after")
    def _one_gpu_choice(self) -> Faults:
        if self.gpus is not None and self.gpus_of is not None:
            raise ValueError("give `gpus` or `gpus_of`, not both")
        return self

    def expand(self, gpus_by_node: dict[str, list[int]] | None = None) -> list[dict[str, Any]]:
        """One simulator fault per node and GPU; `gpus_by_node` (from `gpus_of`) overrides `gpus` per node."""
        rest = dict(self.model_extra or {})
        out = []
        for node in self.nodes:
            chosen = (gpus_by_node or {}).get(node, self.gpus)
            gpus: list[int | None] = list(chosen) if chosen is not None else [None]
            for gpu in gpus:
                out.append({**rest, "node": node, **({"gpu": gpu} if gpu is not None else {})})
        return out


class ClearFaults(Section):
    node: str | None = None
    gpu: int | None = None
    reset: bool = Field(False, description="also a GPU reset: clears the sticky XID and the XID window")


class Reboot(Section):
    """Reboot a node: a new `status.nodeInfo.bootID` and a GPU reset of all its GPUs in the simulator."""

    node: str


class Release(Section):
    """Remove the demo's finalizer from pods of a workload, letting terminating ones go (checkpoint done)."""

    namespace: str = "default"
    workload: str


class Delete(Section):
    kind: str
    name: str
    namespace: str | None = None


class Replicas(Section):
    name: str
    namespace: str = "default"
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=0)


class HpaMetrics(Section):
    name: str
    namespace: str = "default"
    metrics: list[str] = Field(min_length=1)


class FollowPods(Selected):
    pods: int | None = Field(None, ge=1, description="also require this many bound pods")


class Running(Selected):
    count: int = Field(ge=0)


class NumaAligned(Selected):
    pods: int = Field(ge=1)
    gpus: int = Field(ge=1)


class Node(Section):
    node: str
    reason: str | None = Field(None, description="taint value, e.g. xid-79")


class Quarantined(Node):
    debounce: int | None = Field(
        None,
        ge=1,
        description="a graded signal: the GPUQuarantined Event says it held this many consecutive passes",
    )


class SignalState(Section):
    """The controller's `gpuwarden_health_signals{signal,state}` gauge, as Prometheus scraped it."""

    signal: str = Field(description="health.signals name, e.g. nvlink_errors")
    state: Literal["boot-grace", "debouncing", "confirmed"]
    min: int = Field(1, ge=1, description="at least this many GPUs (or nodes) in that state")


class Drained(Selected):
    """The drain moved the workload's pods off the GPUs the node's quarantine record names, and only those:
    GPUPodEvicted Events (GPU scope), no pod of it left on a failed GPU, its others on the node untouched."""

    node: str


class Nodes(Section):
    nodes: list[str] = Field(min_length=1)


class XidSeen(Nodes):
    code: int


class Preempted(Section):
    namespace: str = "default"
    victims: int = Field(ge=0, description="exact number of Preempted events in the namespace")
    preemptor: str = Field(description="workload whose pod must be running after preempting")


class Throttled(Section):
    namespace: str = "default"
    workload: str = Field(description="workload whose pending pod the throttle refused to let preempt")


class Nominated(Selected):
    """A pending pod of the workload carries `status.nominatedNodeName` (= `node` when given)."""

    node: str | None = None


class NominationCleared(Selected):
    pass


class GpuPreempting(Selected):
    """gpuwarden's GPU preemption (make-room) evicted for a pod of the workload: a `GPUPreempting` Event."""


class ParkedAtZero(Section):
    """The HPA (`minReplicas: 0`) parked its Deployment at zero: its `ScaledToZero` condition is True (set
    by the HPA controller only when it scaled the workload from some replicas to zero; Kubernetes 1.37+,
    before that the HPA must at least have rescaled), desired and current replicas 0, no pod of the workload
    left, and `ScalingActive=True`: it still reads its External metric, so traffic can wake it."""

    name: str
    namespace: str = "default"


class Rescaled(Section):
    """The HPA scaled its Deployment up on one of `metrics`: a `SuccessfulRescale` Event on the HPA whose
    reason names that metric as above its target (kube-controller-manager writes `New size: 3; reason:
    external metric router_queue_depth(<selector>) above target`, naming the metric that asked for the most
    replicas). What proves which metric woke a Deployment or scaled it out, not only that it did."""

    name: str
    namespace: str = "default"
    metrics: list[str] = Field(min_length=1, description="any one of these metric names")


class TopPods(Selected):
    """`kubectl top pods` (metrics.k8s.io, served by the adapter) lists every running pod of the workload,
    each with CPU and the memory working set Prometheus holds for it."""

    pods: int | None = Field(None, ge=1, description="also require this many pods listed")


class Expect(Section):
    """Exactly one outcome key, plus how long to wait for it and how long it must then keep holding."""

    replicas: Replicas | None = None
    hpa_metrics: HpaMetrics | None = None
    series_follow_pods: FollowPods | None = None
    running: Running | None = None
    numa_aligned: NumaAligned | None = None
    xid_seen: XidSeen | None = None
    quarantined: Quarantined | None = None
    not_quarantined: Nodes | None = None
    released: Node | None = None
    preempted: Preempted | None = None
    throttled: Throttled | None = None
    nominated: Nominated | None = None
    nomination_cleared: NominationCleared | None = None
    signal_state: SignalState | None = None
    drained: Drained | None = None
    gpu_preempting: GpuPreempting | None = None
    top_pods: TopPods | None = None
    parked_at_zero: ParkedAtZero | None = None
    rescaled: Rescaled | None = None
    within: Seconds | None = Field(None, gt=0, description="default: the step's `within`")
    hold: Seconds = Field(0.0, ge=0, description="after first holding, must keep holding this long")

    @model_validator(mode="after")
    def _exactly_one(self) -> Expect:
        keys = [k for k in OUTCOME_KEYS if getattr(self, k) is not None]
        if len(keys) != 1:
            raise ValueError(f"give exactly one outcome key, got {keys or 'none'}")
        return self

    @property
    def key(self) -> str:
        return next(k for k in OUTCOME_KEYS if getattr(self, k) is not None)

    @property
    def body(self) -> Section:
        value: Section = getattr(self, self.key)
        return value


OUTCOME_KEYS = tuple(k for k in Expect.model_fields if k not in ("within", "hold"))


class Action(Section):
    """Exactly one of the keys."""

    deploy: Deploy | None = None
    job: Job | None = None
    load: Load | None = None
    fault: Faults | None = None
    clear_faults: ClearFaults | None = None
    reboot: Reboot | None = None
    release: Release | None = None
    delete: Delete | None = None
    cordon: str | None = None
    sleep: Seconds | None = Field(None, ge=0)
    wait_for: Expect | None = Field(
        None, description="block until this outcome holds (fails the step if not)"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Action:
        set_keys = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(set_keys) != 1:
            raise ValueError(f"give exactly one action key, got {set_keys or 'none'}")
        return self

    @property
    def key(self) -> str:
        return next(k for k in type(self).model_fields if getattr(self, k) is not None)


class Step(Section):
    name: str = Field(pattern=r"^[a-z0-9][-a-z0-9]*$")
    title: str
    do: list[Action] = Field(default_factory=list)
    expect: list[Expect] = Field(default_factory=list)
    within: Seconds = Field(90.0, gt=0, description="seconds each expectation may take to hold")


class DemoScenario(Section):
    name: str
    description: str = ""
    fleet: Fleet = Field(default_factory=Fleet)
    priority_classes: dict[str, int] = Field(default_factory=dict)
    config: dict[str, Any] = Field(
        default_factory=dict, description="merged over the demo's gpuwarden config (docs/configuration.md)"
    )
    steps: list[Step] = Field(min_length=1)


def _cross_problems(s: DemoScenario) -> list[tuple[str, str]]:
    """Names that must refer to something: nodes, pools, priority classes, unique step names, faults."""
    problems: list[tuple[str, str]] = []
    nodes = set(s.fleet.node_names())
    for pool, spec in s.fleet.pools.items():
        problems += [
            (f"fleet.pools.{pool}.nodes", f"unknown node {n!r}") for n in spec.nodes if n not in nodes
        ]
    seen: set[str] = set()
    engine_in: dict[str, str] = {}  # namespace -> its engine Deployment
    for i, step in enumerate(s.steps):
        if step.name in seen:
            problems.append((f"steps[{i}].name", f"duplicate step name {step.name!r}"))
        seen.add(step.name)
        for j, action in enumerate(step.do):
            where = f"steps[{i}].do[{j}]"
            d = action.deploy
            if d is not None and d.engine is not None and engine_in.setdefault(d.namespace, d.name) != d.name:
                problems.append(
                    (
                        f"{where}.deploy.engine",
                        f"{d.namespace} already has the engine Deployment {engine_in[d.namespace]!r}: the "
                        "workload's engine metrics are summed per namespace, give each its own",
                    )
                )
            w = action.deploy or action.job
            if w is not None:
                if w.pool is not None and w.pool not in s.fleet.pools:
                    problems.append((f"{where}.{action.key}.pool", f"unknown pool {w.pool!r}"))
                if w.priority_class is not None and w.priority_class not in s.priority_classes:
                    problems.append((f"{where}.{action.key}.priority_class", f"unknown {w.priority_class!r}"))
                for key in ("nodes", "prefer_nodes"):
                    bad = [n for n in getattr(w, key) or () if n not in nodes]
                    problems += [(f"{where}.{action.key}.{key}", f"unknown node {n!r}") for n in bad]
            if action.fault is not None:
                placeholder = {n: [0] for n in action.fault.nodes} if action.fault.gpus_of else None
                for k, body in enumerate(action.fault.expand(placeholder)):
                    if body["node"] not in nodes:
                        problems.append((f"{where}.fault.nodes", f"unknown node {body['node']!r}"))
                        break
                    try:
                        fault_adapter.validate_python(body)
                    except ValidationError as exc:
                        problems += problems_of(exc, f"{where}.fault[{k}].")
                        break
    return problems


def parse_demo_scenario(data: Any) -> DemoScenario:
    """Validate a decoded scenario; raises ConfigError listing every problem with its field."""
    if not isinstance(data, dict):
        raise ConfigError([("(top level)", f"expected a mapping, got {type(data).__name__}")])
    try:
        scenario = DemoScenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_of(exc)) from None
    problems = _cross_problems(scenario)
    if problems:
        raise ConfigError(problems)
    return scenario


def load_demo_scenario(path: Path | None = None) -> DemoScenario:
    """Read a scenario YAML file (default: examples/demo/default.yaml)."""
    path = path or DEFAULT_SCENARIO
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([("(file)", f"cannot read {path}: {exc.strerror or exc}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([("(file)", f"not valid YAML: {exc}")]) from None
    return parse_demo_scenario(data)
