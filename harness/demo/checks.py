"""Checking the `expect:` list of a scenario step: every outcome observed in the live system, never assumed.

Why it exists: the demo's exit code is its claim that every capability worked, so each expected outcome is a
probe of real state — the HPA's status and the pods that exist, taints/annotations/conditions on nodes,
Events the scheduler and the controller wrote, series in Prometheus — polled until it holds (within a
deadline) and, for "nothing happens" outcomes, kept under watch for a hold period. A probe returns whether
it holds and a one-line description of what it saw; that line is what the timeline and the report show,
so a failure says what was observed instead.

What it must not do: change anything.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpuwarden.errors import GpuwardenError
from gpuwarden.kube import EVENTS, JsonObject, KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Vector
from gpuwarden.quarantine import decode
from gpuwarden.wellknown import GPU_IDS, GPU_TOPOLOGY
from gpuwarden.wellknown import NUMA_NODE as NUMA
from gpuwarden.wellknown import QUARANTINE_RECORD as QUARANTINE_ANNOTATION
from harness.demo import scenario as sc
from harness.demo.observer import ClusterView, gpu_ids, hpa_metric_values, is_bound, our_taint
from harness.demo.processes import ProcessFailed
from harness.demo.timeline import Outcome, Timeline

Verdict = tuple[bool, str]

HEARTBEAT_SECONDS = 15.0


def condition(node: JsonObject, kind: str) -> str:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status", ""))
    return ""


def taint_text(taint: JsonObject | None) -> str:
    return "none" if taint is None else f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"


def node_state(taint: JsonObject | None, record: object, healthy: str) -> str:
    return (
        f"taint {taint_text(taint)}, annotation {'set' if record else 'absent'}, GPUHealthy={healthy or '?'}"
    )


def metric_values_text(hpa: JsonObject) -> str:
    """`gpu_utilization 75/70, requests_per_second 37.5/40`: each metric as the HPA read it, and its target;
    `none` where it has no reading (not served yet, or an External average over zero replicas)."""
    return ", ".join(
        f"{m} {'none' if math.isnan(c) else f'{c:g}'}/{t:g}" for m, (c, t) in hpa_metric_values(hpa).items()
    )


def describe(expect: sc.Expect) -> str:
    """`quarantined(node=gpu-node-05, reason=xid-79)` for the timeline."""
    fields = ", ".join(f"{k}={v}" for k, v in expect.body.model_dump(exclude_none=True).items())
    return f"{expect.key}({fields})"


class Checks:
    """Probes over the cluster view, the API's Events and Prometheus; `check()` runs one expectation."""

    def __init__(
        self,
        view: ClusterView,
        kube: KubeClient,
        prom: PrometheusClient,
        fleet: sc.Fleet,
        alive: Callable[[], None],
        timeline: Timeline,
        interval: float = 1.0,
        kubectl: Callable[..., str] | None = None,
    ) -> None:
        self.view, self.kube, self.prom, self.fleet = view, kube, prom, fleet
        self.interval = interval
        self.alive = alive
        self.t = timeline
        self.kubectl = kubectl
        """The test bed's kubectl (`Cluster.kubectl`: args -> stdout, raises on failure), for `top_pods`."""

    async def check(self, expect: sc.Expect, within: float) -> Outcome:
        """Poll the probe every `interval` s until it holds (then `hold` seconds more) or time runs out."""
        probe: Callable[[Any], Awaitable[Verdict]] = getattr(self, f"probe_{expect.key}")
        start = time.monotonic()
        first_ok: float | None = None
        ok, detail = False, "not checked"
        said = start
        while True:
            try:
                self.alive()
                ok, detail = await probe(expect.body)
            except ProcessFailed as exc:
                return self.t.outcome(
                    describe(expect), False, str(exc).splitlines()[0], time.monotonic() - start
                )
            except GpuwardenError as exc:  # API server or Prometheus hiccup: not an outcome, try again
                ok, detail = False, f"could not observe: {exc}"
            now = time.monotonic()
            if ok:
                first_ok = now if first_ok is None else first_ok
                if now - first_ok >= expect.hold:
                    held = f" (held {expect.hold:g}s)" if expect.hold else ""
                    return self.t.outcome(describe(expect), True, detail + held, first_ok - start)
            elif first_ok is not None:
                lasted = now - first_ok
                return self.t.outcome(
                    describe(expect), False, f"held {lasted:.0f}s, then: {detail}", now - start
                )
            if first_ok is None and now - start > within:
                return self.t.outcome(
                    describe(expect), False, f"not within {within:g}s; saw: {detail}", now - start
                )
            if now - said > HEARTBEAT_SECONDS:  # a long wait still shows progress
                state = (
                    f"holding for {now - first_ok:.0f}s"
                    if first_ok is not None
                    else f"waiting {now - start:.0f}s"
                )
                self.t.info(f"{describe(expect)}: {state}; {detail}")
                said = now
            await asyncio.sleep(self.interval)

    # ------------------------------------------------------------------------------------------ helpers
    async def events(self, reason: str, namespace: str | None = None) -> list[JsonObject]:
        items = (await self.kube.list_objects(EVENTS, namespace=namespace)).items
        return [e for e in items if e.get("reason") == reason]

    def bound(self, namespace: str, workload: str) -> list[JsonObject]:
        return [p for p in self.view.workload_pods(namespace, workload) if is_bound(p)]

    def running(self, namespace: str, workload: str) -> list[JsonObject]:
        return [
            p
            for p in self.bound(namespace, workload)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def node_or_missing(self, name: str) -> JsonObject:
        node = self.view.node(name)
        if node is None:
            raise GpuwardenError(f"node {name} not in the watch cache")
        return node

    # ------------------------------------------------------------------------------------------ probes
    async def probe_replicas(self, e: sc.Replicas) -> Verdict:
        hpa = self.view.hpa(e.namespace, e.name)
        if hpa is None:
            return False, f"no HPA {e.namespace}/{e.name}"
        desired = int((hpa.get("status") or {}).get("desiredReplicas", 0))
        running = len(self.running(e.namespace, e.name))
        values = metric_values_text(hpa)
        detail = f"HPA desired {desired}, {running} pods running ({values} current/target)"
        low, high = e.min if e.min is not None else 0, e.max if e.max is not None else 10**6
        return low <= desired <= high and running == desired, detail

    async def probe_hpa_metrics(self, e: sc.HpaMetrics) -> Verdict:
        hpa = self.view.hpa(e.namespace, e.name)
        if hpa is None:
            return False, f"no HPA {e.namespace}/{e.name}"
        values = hpa_metric_values(hpa)
        have = {m: c for m, (c, _) in values.items() if c == c}  # NaN: not served yet
        active = {c.get("type"): c.get("status") for c in (hpa.get("status") or {}).get("conditions") or []}
        detail = f"currentMetrics {have or 'none'}; ScalingActive={active.get('ScalingActive', '?')}"
        return set(e.metrics) <= set(have) and active.get("ScalingActive") == "True", detail

    async def probe_parked_at_zero(self, e: sc.ParkedAtZero) -> Verdict:
        hpa = self.view.hpa(e.namespace, e.name)
        if hpa is None:
            return False, f"no HPA {e.namespace}/{e.name}"
        spec, status = hpa.get("spec") or {}, hpa.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        scaled = conditions.get("ScaledToZero")
        active = conditions.get("ScalingActive") or {}
        # desiredReplicas is always in a written status; currentReplicas is omitted when 0 (omitempty)
        desired, current = int(status.get("desiredReplicas", -1)), int(status.get("currentReplicas", 0))
        pods = sorted(p["metadata"]["name"] for p in self.view.workload_pods(e.namespace, e.name))
        if scaled is not None:
            by_hpa = scaled.get("status") == "True"
            why = f"ScaledToZero={scaled.get('status')} ({scaled.get('message', '')})"
        else:  # before Kubernetes 1.37 the HPA has no such condition: it must at least have rescaled
            by_hpa = bool(status.get("lastScaleTime"))
            last = status.get("lastScaleTime", "none")
            why = f"no ScaledToZero condition (before 1.37); lastScaleTime {last}"
        values = metric_values_text(hpa)
        detail = (
            f"minReplicas {spec.get('minReplicas', 1)}, {why}, desired {desired}, current {current}, "
            f"{len(pods)} pods{': ' + ', '.join(pods) if pods else ''}; ScalingActive="
            f"{active.get('status', '?')} ({active.get('reason', '')}); {values} current/target"
        )
        ok = (
            spec.get("minReplicas") == 0
            and by_hpa
            and desired == current == 0
            and not pods
            and active.get("status") == "True"
        )
        return ok, detail

    async def probe_rescaled(self, e: sc.Rescaled) -> Verdict:
        notes = [
            str(x.get("note", ""))
            for x in await self.events("SuccessfulRescale", e.namespace)
            if (x.get("regarding") or {}).get("kind") == "HorizontalPodAutoscaler"
            and x["regarding"].get("name") == e.name
        ]
        wanted = [n for n in notes if "above target" in n and any(f" {m}(" in n for m in e.metrics)]
        said = [n.split("(", 1)[0] + (" above target" if "above target" in n else "") for n in notes]
        detail = f"SuccessfulRescale on HPA {e.namespace}/{e.name}: {'; '.join(said) or 'none'}"
        return bool(wanted), detail

    async def probe_series_follow_pods(self, e: sc.FollowPods) -> Verdict:
        pods = {p["metadata"]["name"] for p in self.bound(e.namespace, e.workload) if gpu_ids(p)}
        seen: dict[str, set[str]] = {}
        for metric in ("DCGM_FI_DEV_GPU_UTIL", "http_requests_total"):
            result = await self.prom.query(f'{metric}{{namespace="{e.namespace}",pod=~"{e.workload}-.*"}}')
            seen[metric] = (
                {s.labels.get("pod", "") for s in result.samples} if isinstance(result, Vector) else set()
            )
        same = all(s == pods for s in seen.values()) and bool(pods) and e.pods in (None, len(pods))
        detail = (
            f"{len(pods)} bound pods; Prometheus has DCGM_FI_DEV_GPU_UTIL for "
            f"{len(seen['DCGM_FI_DEV_GPU_UTIL'])} and http_requests_total for "
            f"{len(seen['http_requests_total'])} of them"
        )
        return same, detail

    async def probe_running(self, e: sc.Running) -> Verdict:
        pods = self.running(e.namespace, e.workload)
        return len(
            pods
        ) == e.count, f"{len(pods)} pods running: {sorted(p['metadata']['name'] for p in pods)}"

    async def probe_numa_aligned(self, e: sc.NumaAligned) -> Verdict:
        pods = self.running(e.namespace, e.workload)
        lines, ok = [], len(pods) == e.pods
        for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
            ids = gpu_ids(pod)
            numas = sorted({self.fleet.numa_of(i) for i in ids})
            recorded = (pod["metadata"].get("annotations") or {}).get(NUMA, "")
            ok = ok and len(ids) == e.gpus and len(numas) == 1 and recorded == ",".join(map(str, numas))
            lines.append(
                f"{pod['metadata']['name']} on {pod['spec']['nodeName']} GPUs "
                f"{(pod['metadata'].get('annotations') or {}).get(GPU_IDS, '-')} NUMA {recorded or '-'}"
            )
        return ok, f"{len(pods)}/{e.pods} pods: " + "; ".join(lines)

    async def probe_xid_seen(self, e: sc.XidSeen) -> Verdict:
        result = await self.prom.query(f"max by (Hostname) (DCGM_FI_DEV_XID_ERRORS == {e.code})")
        nodes = (
            {s.labels.get("Hostname", "") for s in result.samples} if isinstance(result, Vector) else set()
        )
        missing = sorted(set(e.nodes) - nodes)
        return (
            not missing,
            f"Prometheus shows XID {e.code} on {len(set(e.nodes) & nodes)}/{len(e.nodes)} nodes",
        )

    async def probe_quarantined(self, e: sc.Quarantined) -> Verdict:
        node = self.node_or_missing(e.node)
        taint = our_taint(node)
        record = (node["metadata"].get("annotations") or {}).get(QUARANTINE_ANNOTATION)
        healthy = condition(node, "GPUHealthy")
        if taint is None or (e.reason and taint.get("value") != e.reason) or not record or healthy != "False":
            return False, node_state(taint, record, healthy)
        events = [x for x in await self.events("GPUQuarantined") if x["regarding"].get("name") == e.node]
        if not events:
            return False, f"taint {taint_text(taint)}, GPUHealthy=False, no GPUQuarantined Event yet"
        note = str(events[0].get("note", ""))
        if e.debounce is None:
            return True, f"taint {taint_text(taint)}, GPUHealthy=False, Event: {note[:120]}"
        held = f"({e.debounce} consecutive passes)"
        why = note.split("; GPUs", 1)[0]  # the Event's why; GPU UUIDs and the taint follow
        return held in note, f"taint {taint_text(taint)}, GPUHealthy=False, Event: {why[:160]}"

    async def probe_not_quarantined(self, e: sc.Nodes) -> Verdict:
        tainted = sorted(n for n in e.nodes if (node := self.view.node(n)) is not None and our_taint(node))
        everywhere = sorted(n["metadata"]["name"] for n in self.view.nodes.objects() if our_taint(n))
        return (
            not tainted,
            f"none of the {len(e.nodes)} nodes tainted (tainted fleet-wide: {everywhere or 'none'})",
        )

    async def probe_released(self, e: sc.Node) -> Verdict:
        node = self.node_or_missing(e.node)
        taint, healthy = our_taint(node), condition(node, "GPUHealthy")
        record = (node["metadata"].get("annotations") or {}).get(QUARANTINE_ANNOTATION)
        if taint is not None or record or healthy != "True":
            return False, node_state(taint, record, healthy)
        events = [
            x for x in await self.events("GPUQuarantineReleased") if x["regarding"].get("name") == e.node
        ]
        note = str(events[0].get("note", ""))[:120] if events else "no GPUQuarantineReleased Event yet"
        return bool(events), f"no taint, GPUHealthy=True, Event: {note}"

    async def probe_signal_state(self, e: sc.SignalState) -> Verdict:
        query = f'sum by (action) (gpuwarden_health_signals{{signal="{e.signal}",state="{e.state}"}})'
        result = await self.prom.query(query)
        samples = result.samples if isinstance(result, Vector) else []
        count = sum(s.value for s in samples)
        actions = sorted({a for s in samples if (a := s.labels.get("action", ""))})  # "" while in boot grace
        action = f" (action {', '.join(actions)})" if actions else ""
        return (
            count >= e.min,
            f"controller: {e.signal} holds on {count:g} GPU(s)/node(s) in state {e.state}{action}",
        )

    def failed_gpus(self, node: JsonObject) -> tuple[set[int], str]:
        """GPU indices the node's quarantine record names (UUIDs mapped through the topology annotation)."""
        annotations = node["metadata"].get("annotations") or {}
        record, _ = decode(annotations.get(QUARANTINE_ANNOTATION))
        if record is None:
            return set(), "no quarantine record"
        try:
            topology = json.loads(annotations.get(GPU_TOPOLOGY) or "{}")
        except ValueError:
            return set(), "topology annotation unreadable"
        uuids = {ev.gpu for ev in record.evidence if ev.gpu}
        index = {str(v.get("uuid")): int(k) for k, v in topology.items() if isinstance(v, dict)}
        return {index[u] for u in uuids if u in index}, ""

    async def probe_drained(self, e: sc.Drained) -> Verdict:
        node = self.node_or_missing(e.node)
        failed, why = self.failed_gpus(node)
        if not failed:
            return False, why or "the quarantine record names no GPU the topology maps"
        pattern = re.compile(rf"^{re.escape(e.workload)}-")
        evicted = [
            x
            for x in await self.events("GPUPodEvicted", e.namespace)
            if pattern.match(str(x["regarding"].get("name", "")))
        ]
        on_node = [p for p in self.running(e.namespace, e.workload) if p["spec"].get("nodeName") == e.node]
        stuck = sorted(p["metadata"]["name"] for p in on_node if failed & set(gpu_ids(p)))
        kept = sorted(p["metadata"]["name"] for p in on_node if not failed & set(gpu_ids(p)))
        wide = [x for x in evicted if "holds a faulty GPU" not in str(x.get("note", ""))]
        names = sorted(str(x["regarding"]["name"]) for x in evicted)
        gpus = ",".join(map(str, sorted(failed)))
        detail = (
            f"failed GPU {gpus}: GPUPodEvicted {names or 'none'}"
            f"{' (' + str(wide[0].get('note', ''))[:80] + ')' if wide else ''}; "
            f"still on the failed GPU: {stuck or 'none'}; kept on {e.node}: {len(kept)} pod(s)"
        )
        return bool(evicted) and not stuck and not wide, detail

    async def probe_gpu_preempting(self, e: sc.GpuPreempting) -> Verdict:
        pattern = re.compile(rf"^{re.escape(e.workload)}-")
        events = [
            x
            for x in await self.events("GPUPreempting", e.namespace)
            if pattern.match(str(x["regarding"].get("name", "")))
        ]
        if not events:
            return False, f"no GPUPreempting Event for a {e.workload} pod"
        return True, f"{events[0]['regarding']['name']}: {str(events[0].get('note', ''))[:160]}"

    async def probe_top_pods(self, e: sc.TopPods) -> Verdict:
        if self.kubectl is None:
            return False, "no kubectl to run"
        args = ("top", "pods", "-n", e.namespace, "-l", f"app={e.workload}", "--no-headers")
        try:
            out = await asyncio.to_thread(self.kubectl, *args)
        except RuntimeError as exc:  # kubectl failed (metrics not served yet, APIService down...)
            return False, f"kubectl top: {str(exc).splitlines()[0][-160:]}"
        rows = {parts[0]: parts[1:] for line in out.splitlines() if len(parts := line.split()) == 3}
        running = {p["metadata"]["name"] for p in self.running(e.namespace, e.workload)}
        query = (
            f'sum by (pod) (container_memory_working_set_bytes{{namespace="{e.namespace}",'
            f'pod=~"{e.workload}-.*",container!=""}})'
        )
        result = await self.prom.query(query)
        samples = result.samples if isinstance(result, Vector) else []
        prom_mi = {s.labels.get("pod", ""): f"{int(s.value) // 2**20}Mi" for s in samples}
        agree = [p for p, (_, mem) in rows.items() if prom_mi.get(p) == mem]
        busy = [p for p, (cpu, _) in rows.items() if cpu not in ("0", "0m")]
        example = next(iter(sorted(rows.items())), None)
        shown = f"; e.g. {example[0]} {' '.join(example[1])}" if example else ""
        detail = (
            f"kubectl top pods: {len(rows)} rows for {len(running)} running {e.workload} pods{shown}; "
            f"memory equals Prometheus' working set for {len(agree)}, CPU > 0 for {len(busy)}"
        )
        ok = bool(running) and set(rows) == running and len(agree) == len(busy) == len(rows)
        return ok and e.pods in (None, len(rows)), detail

    async def probe_preempted(self, e: sc.Preempted) -> Verdict:
        victims = await self.events("Preempted", e.namespace)
        names = sorted(str(v["regarding"].get("name")) for v in victims)
        winners = [p["metadata"]["name"] for p in self.running(e.namespace, e.preemptor)]
        detail = f"{len(victims)} victim(s) {names}; {e.preemptor} running: {winners or 'no'}"
        return len(victims) == e.victims and bool(winners), detail

    async def probe_throttled(self, e: sc.Throttled) -> Verdict:
        pattern = re.compile(rf"^{re.escape(e.workload)}-")
        events = [
            x
            for x in await self.events("PreemptionThrottled", e.namespace)
            if pattern.match(str(x["regarding"].get("name", "")))
        ]
        if not events:
            return False, f"no PreemptionThrottled Event for a {e.workload} pod"
        return True, f"{events[0]['regarding']['name']}: {str(events[0].get('note', ''))[:140]}"

    async def probe_nominated(self, e: sc.Nominated) -> Verdict:
        nominated = {
            p["metadata"]["name"]: nominee
            for p in self.view.workload_pods(e.namespace, e.workload)
            if not is_bound(p) and (nominee := (p.get("status") or {}).get("nominatedNodeName"))
        }
        ok = any(e.node in (None, node) for node in nominated.values())
        return ok, f"pending {e.workload} pods nominated: {nominated or 'none'}"

    async def probe_nomination_cleared(self, e: sc.NominationCleared) -> Verdict:
        pattern = re.compile(rf"^{re.escape(e.workload)}-")
        events = [
            x
            for x in await self.events("NominationCleared", e.namespace)
            if pattern.match(str(x["regarding"].get("name", "")))
        ]
        if not events:
            return False, f"no NominationCleared Event for a {e.workload} pod"
        name = str(events[0]["regarding"]["name"])
        pod = next(
            (p for p in self.view.workload_pods(e.namespace, e.workload) if p["metadata"]["name"] == name), {}
        )
        still = (pod.get("status") or {}).get("nominatedNodeName")
        return not still, f"{name}: {str(events[0].get('note', ''))[:140]}" + (
            f" (still {still})" if still else ""
        )
