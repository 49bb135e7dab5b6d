"""A vLLM-shaped Deployment's series for the e2e tests: the engine's per-pod queue and the router's queue.

What an engine and the router in front of it would export for a Deployment's actual pods (its Running pods,
read from the test bed): per pod `vllm:num_requests_waiting`, `vllm:num_requests_running` and
`vllm:kv_cache_usage_perc` (vLLM V1's names and labels, with the `namespace` / `pod` labels Prometheus'
Kubernetes discovery adds), and `router_queue_depth{namespace, service}`: the requests waiting in front of
the workload — held by the router while no pod runs, spread over the pods' queues once they do. The test
sets `backlog`; the router's gauge is the whole of it, so it exists at zero replicas and its average per
replica is each pod's queue.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from harness.testbed import Cluster


@dataclass
class VllmShaped:
    cluster: Cluster
    namespace: str
    name: str
    backlog: float = 0.0
    _pods: list[str] = field(default_factory=list)
    _pods_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pods(self) -> list[str]:
        if time.monotonic() - self._pods_at > 1.0:
            items = self.cluster.get_json("pods", "-n", self.namespace, "-l", f"app={self.name}")["items"]
            self._pods = [p["metadata"]["name"] for p in items if p["status"].get("phase") == "Running"]
            self._pods_at = time.monotonic()
        return self._pods

    def lines(self) -> list[str]:
        with self._lock:
            pods = self.pods()
            where = f'namespace="{self.namespace}"'
            out = ["# TYPE router_queue_depth gauge"]
            out.append(f'router_queue_depth{{{where},service="{self.name}"}} {self.backlog}')
            per_pod = self.backlog / len(pods) if pods else 0.0
            families = (
                ("vllm:num_requests_waiting", per_pod),
                ("vllm:num_requests_running", min(per_pod, 8.0)),
                ("vllm:kv_cache_usage_perc", min(1.0, 0.2 + per_pod / 20)),
            )
            for family, value in families:
                out.append(f"# TYPE {family} gauge")
                for pod in pods:
                    out.append(f'{family}{{engine="0",model_name="m",{where},pod="{pod}"}} {value}')
            return out
