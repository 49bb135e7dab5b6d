"""A serving engine per pod (vLLM- or TGI-shaped) and the router queue in front of a workload: pure state.

Why it exists: the adapter's engine presets (adapter/engines.py) scale on what a serving engine reports —
requests waiting, requests running, KV-cache use, time to first token, generated tokens. To exercise them
against a real Prometheus the simulator needs those series to behave like an engine's: a queue that grows
when a pod gets more requests than it can serve and drains when replicas are added, a KV cache that fills
with the running batch, a TTFT that grows with the wait. And for scale-to-zero, a router in front of the
workload whose queue holds requests while no pod runs. A fluid model, stepped with the fleet's tick; no
I/O, no clock (times are passed in). `exposition.render_engines` writes the series under the engines' own
names, as an engine would (the simulator imports nothing of the product); tests/integration holds the
adapter's presets to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

EngineKind = Literal["vllm", "tgi"]

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (s) of the simulated TTFT histogram (a subset of vLLM's), +Inf added on output."""
PREFILL_SECONDS = 0.08
"""TTFT of a request that does not wait: its prefill."""
DECODE_SECONDS = 2.0
"""How long a request runs once admitted (its decode): with the admitted rate, the running batch (Little)."""
TOKENS_PER_REQUEST = 200
"""Generated tokens per request."""
ROUTER_HOLD_SECONDS = 30.0
"""How long the router holds a request for a backend before it gives up (the queue's bound with no pod)."""


@dataclass
class EngineState:
    """One pod's engine: gauges now, counters since the pod started."""

    waiting: float = 0.0
    running: float = 0.0
    kv_cache: float = 0.0
    generated_tokens: float = 0.0
    ttft_buckets: list[float] = field(default_factory=lambda: [0.0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: float = 0.0


def step(state: EngineState, arrivals: float, capacity: float, dt: float) -> None:
    """Advance one pod's engine by `dt` seconds at `arrivals` requests/s with `capacity` requests/s of
    service: the queue takes what exceeds the capacity and drains at the spare capacity."""
    backlog = state.waiting + arrivals * dt
    served = min(backlog, capacity * dt)
    state.waiting = backlog - served
    rate = served / dt if dt > 0 else 0.0
    max_running = capacity * DECODE_SECONDS * 1.1
    state.running = rate * DECODE_SECONDS
    state.kv_cache = min(1.0, state.running / max_running + (0.05 if state.waiting > 0 else 0.0))
    state.generated_tokens += served * TOKENS_PER_REQUEST
    ttft = PREFILL_SECONDS + (state.waiting / capacity if capacity > 0 else 0.0)
    for i, le in enumerate(TTFT_BUCKETS):
        if ttft <= le:
            state.ttft_buckets[i] += served
    state.ttft_sum += ttft * served
    state.ttft_count += served


@dataclass
class Router:
    """The router in front of one workload: with no pod it holds requests (those older than the hold time
    give up); once pods run it hands what it holds to them."""

    waiting: float = 0.0

    def step(self, arrivals: float, pods: int, dt: float) -> float:
        """Advance by `dt`; returns the requests handed to the pods now (0 while none runs)."""
        if pods == 0:
            self.waiting = min(self.waiting + arrivals * dt, arrivals * ROUTER_HOLD_SECONDS)
            return 0.0
        handed, self.waiting = self.waiting, 0.0
        return handed


@dataclass
class Engines:
    """The engine of every pod of one workload and its router."""

    kind: EngineKind
    model: str = "simulated/llm"
    pods: dict[str, EngineState] = field(default_factory=dict)
    router: Router = field(default_factory=Router)

    def step(self, arrivals: float, capacity_by_pod: dict[str, float], dt: float) -> None:
        """Advance the router and every pod (`capacity_by_pod`: the pods running now and their service
        rate); the workload's `arrivals` are split evenly, pods that are gone are dropped."""
        for gone in set(self.pods) - set(capacity_by_pod):
            del self.pods[gone]
        handed = self.router.step(arrivals, len(capacity_by_pod), dt)
        if not capacity_by_pod:
            return
        share = arrivals / len(capacity_by_pod)
        for name, capacity in capacity_by_pod.items():
            state = self.pods.setdefault(name, EngineState())
            state.waiting += handed / len(capacity_by_pod)
            step(state, share, capacity, dt)
