"""`gpuwarden demo`: the main job, end to end, on a local kwok GPU fleet, with checks and an HTML report.

Why a package: the demo is the first thing a new user runs (`make demo`), and the only place where every
piece of gpuwarden runs together against real Kubernetes components. It is split by concept:
`scenario` (the scripted timeline file), `stack` and `processes` (bring-up of the control plane, simulator,
Prometheus, adapter and controller), `observer` and `podsync` (the live view of the cluster, pod -> GPU
mapping into the simulator), `actions` and `checks` (playing a step, observing its outcomes), `timeline`
(terminal output), `queries`, `figures`, `plots` and `report` (the report folder), and `runner` (the order).

It runs the deployables as subprocesses through the `gpuwarden` CLI and never imports `adapter` or
`controller`.
"""

from harness.demo.runner import run_demo
from harness.demo.scenario import DEFAULT_SCENARIO, DemoScenario, load_demo_scenario

__all__ = ["DEFAULT_SCENARIO", "DemoScenario", "load_demo_scenario", "run_demo"]
