"""`gpuwarden demo` end to end: the default scenario (hold periods shortened) must pass and write its report;
`--keep` must leave a cluster kubectl can use, and Ctrl-C must then remove everything.

The demo builds its own control plane (its kube-scheduler is configured with the extender from the start),
so these tests do not use the session cluster. They run the demo as a subprocess, as a user would, through
`python -m gpuwarden demo` (the CLI a user runs).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.demo.scenario import DEFAULT_SCENARIO, parse_demo_scenario
from harness.testbed import Binaries, poll

pytestmark = pytest.mark.e2e

REPORT_FILES = (
    "index.html",
    "autoscaling-llm-serve.png",
    "autoscaling-llm-burst.png",  # the HPA with minReplicas 0: parked, woken, parked again
    "quarantine.png",
    "numa-map.png",
    "preemptions.png",
)
MAX_HOLD = 8.0


def shortened(doc: dict[str, Any]) -> dict[str, Any]:
    """The default scenario with every `hold` capped at MAX_HOLD seconds (the story is unchanged)."""
    for step in doc["steps"]:
        for expect in step.get("expect") or []:
            if expect.get("hold", 0) > MAX_HOLD:
                expect["hold"] = MAX_HOLD
    return doc


def demo(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwarden", "demo", *args]


def test_default_scenario_passes_and_writes_the_report(tmp_path: Path) -> None:
    doc = shortened(yaml.safe_load(DEFAULT_SCENARIO.read_text()))
    parse_demo_scenario(doc)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "report"
    started = time.monotonic()
    done = subprocess.run(
        demo("--scenario", str(scenario), "--out", str(out)), capture_output=True, text=True, timeout=1200
    )
    took = time.monotonic() - started
    print(
        f"\n[e2e] demo (shortened default scenario) took {took:.0f}s, exit {done.returncode}", file=sys.stderr
    )
    assert done.returncode == 0, f"demo failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert "demo PASSED" in done.stdout
    for name in REPORT_FILES:
        path = out / name
        assert path.is_file() and path.stat().st_size > 2000, f"{path} missing or empty"
    page = (out / "index.html").read_text()
    assert "PASSED" in page and "NOT observed" not in page
    parked = "<code>parked_at_zero(name=llm-burst, namespace=inference)</code></td><td>observed"
    assert page.count(parked) == 2  # HPA minReplicas 0: parked before the traffic and again after it
    assert "export KUBECONFIG=" in done.stdout


MINIMAL = {
    "name": "keep",
    "fleet": {"nodes": 2},
    "steps": [
        {
            "name": "serve",
            "title": "one pod serving 10 QPS",
            "do": [{"deploy": {"name": "web", "namespace": "keep", "gpus": 2, "qps": 10}}],
            "expect": [{"series_follow_pods": {"workload": "web", "namespace": "keep", "pods": 1}}],
        }
    ],
}


def test_keep_leaves_a_usable_cluster_until_ctrl_c(tmp_path: Path) -> None:
    scenario = tmp_path / "keep.yaml"
    scenario.write_text(yaml.safe_dump(MINIMAL))
    log = tmp_path / "demo.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            demo("--scenario", str(scenario), "--out", str(tmp_path / "report"), "--keep"),
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        match = poll(
            lambda: re.search(r"export KUBECONFIG=(\S+)", log.read_text()),
            timeout=300,
            what="the demo to print how to use the kept cluster",
        )
        kubeconfig = match.group(1)
        kubectl = str(Binaries.locate().path("kubectl"))
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"KUBECONFIG": kubeconfig}
        pods = subprocess.run(
            [kubectl, "get", "pods", "-n", "keep", "-o", "name"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert pods.returncode == 0 and pods.stdout.startswith("pod/web-"), pods.stdout + pods.stderr
        assert proc.poll() is None, "the demo exited although --keep was given"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert "demo PASSED" in text and "stopped and removed" in text
    gone = subprocess.run(
        [kubectl, "get", "nodes"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert gone.returncode != 0, "the cluster still answers after Ctrl-C"
