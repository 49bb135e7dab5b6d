"""Fleet simulator: a dcgm-exporter-compatible exporter for a simulated GPU fleet (`gpuwarden simulate`).

Why it exists: every tier above the unit tests — a real Prometheus, the adapter feeding an HPA, the health
controller, the demo — needs GPU metrics with known behaviour (sticky XIDs, ECC counters, faults at given
times, utilization that follows load) at sizes up to 5,000 nodes x 8 GPUs, without GPUs.

Modules, bottom-up: `scenario` (the YAML file as typed models), `workload` (load curves, placement),
`hardware` (GPU identity and readings), `fleet` (pure state advanced by an injected clock), `exposition`
(fast Prometheus text), `compression` (cached gzip), `control` (the HTTP control API), `server` (aiohttp
shell and the entry points `serve` and `start`). Example scenarios: examples/scenarios/.
"""

from harness.simulator.fleet import Fleet
from harness.simulator.scenario import Scenario, load_scenario, parse_scenario
from harness.simulator.server import RunningSimulator, Simulator, build_app, serve, start

__all__ = [
    "Fleet",
    "RunningSimulator",
    "Scenario",
    "Simulator",
    "build_app",
    "load_scenario",
    "parse_scenario",
    "serve",
    "start",
]
