"""Bring-up and teardown of the whole local stack the demo plays its scenario on.

Why it exists: the demo is only convincing if every piece is the real one, wired as in production —
kube-apiserver, kube-controller-manager's HPA controller and kube-scheduler from the test bed; kwok GPU
nodes that advertise `nvidia.com/gpu` and gpuwarden's topology annotation; the fleet simulator as the
dcgm-exporter (and as the gateway in front of the inference workloads); a real Prometheus scraping it;
`gpuwarden adapter` behind real APIServices; `gpuwarden controller` with its extender wired into
kube-scheduler's configuration. This module starts them in dependency order, each with a readiness check and
a timeline line, and stops them in reverse order.

Everything listens on 127.0.0.1 only. All files live under one work directory (configs, TLS, logs,
kubeconfig, TSDB), which is kept after the run for inspection.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwarden import ports
from harness.demo import manifests
from harness.demo.processes import ManagedProcess, gpuwarden_command, stop_all
from harness.demo.scenario import DemoScenario
from harness.demo.timeline import Timeline
from harness.localprom import LocalPrometheus, scrape_target
from harness.testbed import (
    Binaries,
    Cluster,
    ClusterConfig,
    ExtenderSpec,
    LocalAPIService,
    SchedulerSettings,
    add_gpu_nodes,
    register_local_apiservice,
    scheduler_configuration,
    wait_apiservice_available,
)
from harness.testbed.pki import make_ca, serving_cert_for_service

LOCALHOST = "127.0.0.1"
NAMESPACE = "gpuwarden"
ADAPTER_SERVICE = "gpuwarden-adapter"
EXTENDER_PREFIX = "/gpuwarden"
APIS = (
    ("custom.metrics.k8s.io", "v1beta2"),
    ("custom.metrics.k8s.io", "v1beta1"),
    ("external.metrics.k8s.io", "v1beta1"),
    ("metrics.k8s.io", "v1beta1"),  # kubectl top, from the simulator's cAdvisor series
)
RATE = "[5s]"  # five 1 s scrapes (kube-prometheus: 120 s = four 30 s scrapes)
ENGINE_WAITING = "vllm:num_requests_waiting"
ENGINE_KV = "vllm:kv_cache_usage_perc"
"""The vLLM series the engine rules read (vLLM V1's names, as the simulator exports them). Their home is
`adapter.engines`, which the demo may not import (the CLI starts it, and the kernel imports no deployable):
tests/unit/test_demo_scenario.py holds these equal to it."""
SCALE_TO_ZERO_GATE = {"kubeFeatureGates": "HPAScaleToZero=true"}
"""HPA `minReplicas: 0` on External metrics: beta and on by default from 1.37 (the test bed's release), alpha
and off before; set explicitly so the demo also parks at zero on a test bed built for an older release."""


def gateway_rule() -> dict[str, Any]:
    """prometheus-adapter `externalRules` entry: the simulator's `gateway_requests_total{namespace, service}`
    as the External metric `gateway_requests_per_second`, selected by `service` (an HPA's
    `metric.selector`). It exists while the workload runs no pod: what an HPA at zero replicas can read."""
    return {
        "seriesQuery": f'{manifests.GATEWAY_SERIES}{{namespace!="",service!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "name": {"matches": f"^{manifests.GATEWAY_SERIES}$", "as": manifests.GATEWAY_METRIC},
        "metricsQuery": f"sum(rate(<<.Series>>{{<<.LabelMatchers>>}}{RATE})) by (namespace)",
    }


def engine_rules() -> list[dict[str, Any]]:
    """`externalRules` entries for a Deployment with a vLLM engine, per namespace (one engine Deployment per
    namespace, which the scenario model checks): the pods' waiting requests summed, and each pod's fullest
    KV cache summed, so an HPA's AverageValue target reads the per-pod average of `vllm_queue_depth` /
    `vllm_kv_cache_usage` (the adapter's per-pod engine presets, a Pods metric an HPA at zero replicas cannot
    read). Discovered from the router's gauge, which exists while no pod runs; with no pod both are 0 (`or`
    the router's series times 0), so an HPA parked at zero reads every metric and stays ScalingActive."""
    router = f'{manifests.ROUTER_METRIC}{{namespace!=""}}'
    at_zero = "(0 * sum(<<.Series>>{<<.LabelMatchers>>}) by (namespace))"
    waiting = f"sum({ENGINE_WAITING}{{<<.LabelMatchers>>}}) by (namespace)"
    kv = f"sum(max({ENGINE_KV}{{<<.LabelMatchers>>}}) by (namespace, pod)) by (namespace)"
    return [
        {
            "seriesQuery": router,
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"matches": f"^{manifests.ROUTER_METRIC}$", "as": metric},
            "metricsQuery": f"{query} or {at_zero}",
        }
        for metric, query in ((manifests.ENGINE_QUEUE_METRIC, waiting), (manifests.ENGINE_KV_METRIC, kv))
    ]


def resource_rule(series: str, rate: bool) -> dict[str, Any]:
    """prometheus-adapter `resourceRules` entry over cAdvisor series; a node's usage is the sum of its
    containers' (the simulated nodes run nothing else: no node-exporter to read)."""
    value = f'{series}{{<<.LabelMatchers>>,container!="",pod!=""}}'
    if rate:
        value = f"irate({value}{RATE})"
    query = f"sum by (<<.GroupBy>>) ({value})"
    return {
        "containerQuery": query,
        "nodeQuery": query,
        "containerLabel": "container",
        "resources": {"overrides": {k: {"resource": k} for k in ("namespace", "pod", "node")}},
    }


def free_port() -> int:
    return ports.free_port(LOCALHOST)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` wins; nested mappings are merged key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def gpuwarden_config(
    *, kubeconfig: Path, prometheus_url: str, adapter_port: int, extender_port: int, tls: tuple[Path, Path]
) -> dict[str, Any]:
    """The demo's config file: production defaults, with intervals short enough for a few-minute story."""
    return {
        "prometheus": {"url": prometheus_url, "timeout_seconds": 5},
        "kubernetes": {
            "kubeconfig": str(kubeconfig),
            "namespace": NAMESPACE,
            "leader_election": {
                "lease_name": "gpuwarden-controller",
                "lease_duration_seconds": 6,
                "renew_deadline_seconds": 4,
                "retry_period_seconds": 1,
            },
        },
        "adapter": {
            "bind_address": LOCALHOST,
            "secure_port": adapter_port,
            "tls": {"cert_file": str(tls[0]), "key_file": str(tls[1])},
            "relist_interval_seconds": 5,
            "cache": {"refresh_interval_seconds": 1, "max_age_seconds": 10},
            "presets": {"requests_per_second": {"rate_window_seconds": 10}},
            "resourceRules": {
                "cpu": resource_rule("container_cpu_usage_seconds_total", rate=True),
                "memory": resource_rule("container_memory_working_set_bytes", rate=False),
            },
            "externalRules": [gateway_rule(), *engine_rules()],
        },
        "health": {
            "loop_interval_seconds": 1,
            "max_sample_age_seconds": 15,
            "healthy_period_seconds": 10,
            "gpu_missing_grace_seconds": 15,
            "xid": {"event_window_seconds": 30},
            # production: 600 s grace, 5 min rate window; the demo's nodes all boot at bring-up, so its
            # first step falls inside the grace and its Fabric Manager step minutes after it
            "signals": {"boot_grace_seconds": 90, "window_seconds": 30},
        },
        "nominations": {"loop_interval_seconds": 2, "ttl_seconds": 30},
        "preemption": {"max_chain_depth": 1},
        "extender": {
            "bind_address": LOCALHOST,
            "port": extender_port,
            "path_prefix": EXTENDER_PREFIX,
            "scoring": {"error_trend_refresh_seconds": 5},
        },
        "logging": {"level": "info", "format": "json"},
    }


def extender_scheduler_config(port: int) -> dict[str, Any]:
    """kube-scheduler calls our extender for every pod that requests `nvidia.com/gpu` (all four verbs)."""
    spec = ExtenderSpec(
        url_prefix=f"http://{LOCALHOST}:{port}{EXTENDER_PREFIX}",
        filter_verb="filter",
        prioritize_verb="prioritize",
        preempt_verb="preempt",
        bind_verb="bind",
        weight=5,
        node_cache_capable=True,
        ignorable=False,
        http_timeout="5s",
        managed_resources=["nvidia.com/gpu"],
    )
    return scheduler_configuration(SchedulerSettings(extenders=[spec]))


def scenario_namespaces(scenario: DemoScenario) -> list[str]:
    names = {NAMESPACE}
    for step in scenario.steps:
        for action in step.do:
            for body in (action.deploy, action.job, action.load):
                if body is not None:
                    names.add(body.namespace)
    return sorted(names)


@dataclass
class Stack:
    """The running pieces; `teardown()` stops them all (the cluster last)."""

    workdir: Path
    scenario: DemoScenario
    timeline: Timeline
    cluster: Cluster | None = None
    prometheus: LocalPrometheus | None = None
    simulator: ManagedProcess | None = None
    adapter: ManagedProcess | None = None
    controller: ManagedProcess | None = None
    apiservices: list[LocalAPIService] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    config_path: Path | None = None

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def simulator_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports['simulator']}"

    @property
    def controller_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports['controller']}"

    def check_processes(self) -> None:
        """Raise if a child died (a crashed controller must fail the demo, not silently pass checks)."""
        for child in (self.simulator, self.adapter, self.controller):
            if child is not None:
                child.check_alive()

    async def start_cluster(self) -> None:
        """The control plane (scheduler wired to our extender's port), namespaces and the GPU nodes."""
        t = self.timeline
        fleet = self.scenario.fleet
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = {k: free_port() for k in ("simulator", "adapter", "controller")}
        binaries = Binaries.locate()
        version = binaries.versions.get("kubernetes", "?")
        t.info(
            f"control plane {version}: kube-apiserver, etcd, kube-controller-manager (feature gate "
            "HPAScaleToZero on), kube-scheduler, kwok"
        )
        config = ClusterConfig(
            name="gpuwarden-demo",
            workdir=self.workdir / "cluster",
            scheduler_config=extender_scheduler_config(self.ports["controller"]),
            hpa_sync_period="2s",
            hpa_downscale_stabilization="5s",
            progress=False,
            kwokctl_options=SCALE_TO_ZERO_GATE,
        )
        self.cluster = cluster = await asyncio.to_thread(Cluster.create, config, binaries)
        t.info(f"control plane ready in {cluster.timings.get('ready_s', 0):.1f}s at {cluster.server}")

        objects = [manifests.namespace(n) for n in scenario_namespaces(self.scenario)]
        objects += [manifests.priority_class(n, v) for n, v in self.scenario.priority_classes.items()]
        await asyncio.to_thread(cluster.apply, *objects)
        specs = manifests.node_specs(fleet)
        await asyncio.to_thread(add_gpu_nodes, cluster, specs, timeout=120)
        await asyncio.gather(*(self.patch_node_status(s.name, manifests.boot_id_patch()) for s in specs))
        pools = ", ".join(f"{p}: {', '.join(s.nodes)}" for p, s in fleet.pools.items()) or "none"
        t.info(
            f"{len(specs)} kwok GPU nodes x {fleet.gpus_per_node} GPUs ({fleet.numa_nodes} NUMA nodes each, "
            f"topology annotated); pools: {pools}"
        )

    async def start_services(self, observer_port: int) -> None:
        """Simulator, Prometheus, adapter (+ APIServices) and controller, each checked ready."""
        t = self.timeline
        fleet = self.scenario.fleet
        cluster = self.cluster
        assert cluster is not None

        sim_scenario = self.workdir / "simulator.yaml"
        sim_fleet = {
            "nodes": fleet.nodes,
            "gpus_per_node": fleet.gpus_per_node,
            "numa_nodes": fleet.numa_nodes,
            "node_name_pattern": fleet.node_name_pattern,
        }
        exporter = {"tick": 1, "cadvisor": True}  # cAdvisor series: what `kubectl top` reads through us
        sim_scenario.write_text(yaml.safe_dump({"fleet": sim_fleet, "exporter": exporter}))
        listen = f"{LOCALHOST}:{self.ports['simulator']}"
        self.simulator = ManagedProcess(
            "gpuwarden simulate",
            gpuwarden_command(
                "simulate", "--scenario", str(sim_scenario), "--listen", listen, "--log-format", "json"
            ),
            self.logs / "simulator.log",
        ).start()
        await self.simulator.wait_ready(f"{self.simulator_url}/healthz")
        t.info(f"gpuwarden simulate (dcgm-exporter for {fleet.nodes * fleet.gpus_per_node} GPUs) on {listen}")

        targets = [
            scrape_target("dcgm", listen, honor_labels=True),
            scrape_target("gpuwarden-controller", f"{LOCALHOST}:{self.ports['controller']}"),
            scrape_target("demo-observer", f"{LOCALHOST}:{observer_port}"),
        ]
        self.prometheus = prom = LocalPrometheus(self.workdir / "prometheus", targets, 1.0)
        await prom.start()
        await prom.wait_for_up("dcgm")
        t.info(f"Prometheus scraping the simulator, the controller and the demo every 1s at {prom.url}")

        ca = make_ca("gpuwarden-demo-adapter-ca")
        tls = serving_cert_for_service(ca, ADAPTER_SERVICE, NAMESPACE).write(self.workdir / "tls", "adapter")
        (self.workdir / "tls" / "ca.crt").write_bytes(ca.cert_pem)
        doc = gpuwarden_config(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=prom.url,
            adapter_port=self.ports["adapter"],
            extender_port=self.ports["controller"],
            tls=tls,
        )
        doc = deep_merge(doc, self.scenario.config)
        self.config_path = self.workdir / "gpuwarden.yaml"
        self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))

        self.adapter = ManagedProcess(
            "gpuwarden adapter",
            gpuwarden_command("adapter", "--config", str(self.config_path)),
            self.logs / "adapter.log",
        ).start()
        self.controller = ManagedProcess(
            "gpuwarden controller",
            gpuwarden_command("controller", "--config", str(self.config_path)),
            self.logs / "controller.log",
        ).start()
        adapter_url = f"https://{LOCALHOST}:{self.ports['adapter']}/readyz"
        await self.adapter.wait_ready(adapter_url, within=90, cafile=self.workdir / "tls" / "ca.crt")
        for group, version in APIS:
            self.apiservices.append(
                await asyncio.to_thread(
                    register_local_apiservice,
                    cluster,
                    group=group,
                    version=version,
                    port=self.ports["adapter"],
                    service_name=ADAPTER_SERVICE,
                    namespace=NAMESPACE,
                    ca_bundle=ca.cert_pem,
                )
            )
        for reg in self.apiservices:
            await asyncio.to_thread(wait_apiservice_available, cluster, reg.name, timeout=90)
        names = ", ".join(r.name for r in self.apiservices)
        t.info(f"gpuwarden adapter on :{self.ports['adapter']}, APIServices Available: {names}")
        await self.controller.wait_ready(f"{self.controller_url}/readyz", within=90)
        t.info(
            f"gpuwarden controller on :{self.ports['controller']} (its loops, and the extender that kube-"
            f"scheduler calls at {EXTENDER_PREFIX}: filter/prioritize/preempt/bind)"
        )

    async def patch_node_status(self, node: str, patch: dict[str, Any]) -> None:
        assert self.cluster is not None
        await asyncio.to_thread(
            self.cluster.kubectl,
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )

    async def teardown(self) -> None:
        """Controller, adapter, simulator, Prometheus, then the cluster (APIServices first)."""
        stop_all()
        if self.prometheus is not None:
            await self.prometheus.stop()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.delete)
            shutil.rmtree(self.workdir / "cluster" / "clusters", ignore_errors=True)
