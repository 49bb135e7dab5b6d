"""`gpuwarden demo`: bring the stack up, play the scenario step by step, write the report, tear down.

Why it exists: this is the one command a new user runs (`make demo`). It owns the order of things and the
promise behind the exit code: 0 only if every expected outcome of every step was observed. It prints a
timeline throughout, names the report folder at the end, and says how to keep the cluster running and
point kubectl at it (`--keep` keeps everything up until Ctrl-C).

What it must not do: decide outcomes (checks.py) or build objects (manifests.py); it only sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden.config.prometheus import PrometheusConfig
from gpuwarden.errors import ConfigError
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from harness.demo.actions import ActionFailed, Actions
from harness.demo.checks import Checks
from harness.demo.observer import ClusterView, serve_metrics
from harness.demo.podsync import PodSync
from harness.demo.report import Placement, RunRecord, write_report
from harness.demo.scenario import DemoScenario, load_demo_scenario
from harness.demo.stack import Stack, free_port
from harness.demo.timeline import Timeline
from harness.testbed import TestbedMissingError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass
class Session:
    """What one run accumulates for the report besides the timeline."""

    placements: dict[str, Placement] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def default_out_dir() -> Path:
    return Path.cwd() / f"demo-report-{time.strftime('%Y%m%d-%H%M%S')}"


async def _play(
    scenario: DemoScenario, stack: Stack, view: ClusterView, kube: KubeClient, session: Session
) -> None:
    t = stack.timeline
    assert stack.prometheus is not None
    prom_cfg = PrometheusConfig.model_validate(
        {"url": stack.prometheus.url, "timeout_seconds": 5, "retries": 0}
    )
    async with PrometheusClient(prom_cfg) as prom:
        assert stack.cluster is not None
        kubectl = stack.cluster.kubectl
        checks = Checks(view, kube, prom, scenario.fleet, stack.check_processes, t, kubectl=kubectl)
        actions = Actions(stack, view, kube, checks, t)
        for i, step in enumerate(scenario.steps, 1):
            t.phase(f"step {i}/{len(scenario.steps)} [{step.name}] {step.title}", step=step.name)
            try:
                for action in step.do:
                    await actions.run(action)
            except ActionFailed as exc:
                if not exc.args[0].startswith("wait_for:"):  # a failed wait was already reported
                    t.outcome("actions", False, str(exc), 0.0)
                session.placements[step.name] = Placement.snapshot(view)
                continue
            await asyncio.gather(*(checks.check(e, e.within or step.within) for e in step.expect))
            session.placements[step.name] = Placement.snapshot(view)


async def _wait_for_ctrl_c(stack: Stack) -> None:
    assert stack.cluster is not None and stack.prometheus is not None
    kubectl = stack.cluster.binaries.path("kubectl")
    print(
        "\nThe cluster keeps running until you press Ctrl-C (then everything is stopped and removed):\n"
        f"  export KUBECONFIG={stack.cluster.kubeconfig}\n"
        f"  {kubectl} get nodes,hpa,pods -A -o wide\n"
        f"  Prometheus: {stack.prometheus.url}   simulator control API: {stack.simulator_url}/control/state",
        flush=True,
    )
    while True:
        await asyncio.sleep(5)
        stack.check_processes()


async def run_async(scenario: DemoScenario, out_dir: Path, keep: bool, timeline: Timeline) -> int:
    t = timeline
    session = Session()
    stack = Stack(out_dir / "run", scenario, t)
    tasks: list[asyncio.Task[None]] = []
    kube: KubeClient | None = None
    observer = None
    t.phase(f"gpuwarden demo: scenario {scenario.name!r} -> report in {out_dir}")
    try:
        await stack.start_cluster()
        assert stack.cluster is not None
        kube = KubeClient.from_config(kubeconfig=stack.cluster.kubeconfig)
        view = ClusterView(kube)
        tasks.append(asyncio.create_task(view.run()))
        observer_port = free_port()
        observer = await serve_metrics(view, observer_port)
        await stack.start_services(observer_port)
        podsync = PodSync(view, stack.simulator_url, t)
        tasks.append(asyncio.create_task(podsync.run()))
        await asyncio.wait_for(podsync.synced.wait(), 60)
        session.timings["bring_up_s"] = t.elapsed
        t.info(f"stack up in {t.elapsed:.1f}s; pod -> GPU sync to the simulator running")
        await _play(scenario, stack, view, kube, session)
        session.timings["scenario_s"] = t.elapsed - session.timings["bring_up_s"]
        t.phase("report")
        assert stack.prometheus is not None
        index = await write_report(
            RunRecord(scenario, t, session.placements, session.timings, stack.prometheus.url, kube), out_dir
        )
        t.info(f"report written: {index}")
        failed = [o for o in t.outcomes if not o.passed]
        verdict = (
            "PASSED" if t.passed else f"FAILED ({len(failed)} of {len(t.outcomes)} outcomes not observed)"
        )
        t.phase(
            f"demo {verdict}: {len(t.outcomes) - len(failed)}/{len(t.outcomes)} expected outcomes observed"
        )
        for o in failed:
            t.warn(f"[{o.step}] {o.expectation}: {o.detail}")
        t.info(f"report: {index}")
        if keep:
            with contextlib.suppress(asyncio.CancelledError):
                await _wait_for_ctrl_c(stack)
        else:
            assert stack.cluster is not None
            kubeconfig, bin_dir = stack.cluster.kubeconfig, stack.cluster.binaries.bin_dir
            t.info(
                "to keep the cluster running afterwards, run `gpuwarden demo --keep`, then point kubectl at "
                f"it: `export KUBECONFIG={kubeconfig}` (kubectl is in {bin_dir})"
            )
        return EXIT_OK if t.passed else EXIT_FAILED
    except (asyncio.CancelledError, KeyboardInterrupt):
        t.warn("interrupted")
        return EXIT_FAILED
    except Exception as exc:
        t.outcome("stack", False, f"{type(exc).__name__}: {exc}", 0.0)
        t.warn(f"logs: {stack.logs} and {stack.workdir / 'cluster'}")
        return EXIT_FAILED
    finally:
        down = t.elapsed
        t.phase("teardown")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if observer is not None:
            await observer.cleanup()
        if kube is not None:
            await kube.aclose()
        await stack.teardown()
        t.info(
            f"stopped and removed in {t.elapsed - down:.1f}s; total {t.elapsed:.1f}s; logs in {stack.logs}"
        )


def run_demo(scenario: Path | None = None, out_dir: Path | None = None, keep: bool = False) -> int:
    """The `gpuwarden demo [--scenario FILE] [--keep]` entry point; returns the process exit code."""
    try:
        loaded = load_demo_scenario(scenario)
    except ConfigError as exc:
        for where, message in exc.problems:
            print(f"{scenario}: {where}: {message}", file=sys.stderr)
        return EXIT_USAGE
    out = out_dir or default_out_dir()
    timeline = Timeline()

    async def main() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, task.cancel)
        try:
            return await run_async(loaded, out, keep, timeline)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(ValueError, RuntimeError):
                    loop.remove_signal_handler(sig)

    try:
        return asyncio.run(main())
    except TestbedMissingError as exc:
        print(f"gpuwarden demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
