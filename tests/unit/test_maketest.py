"""harness.maketest: `make test`'s runner (tiers in the foreground, builds early in the background, times).

The pure parts are table-tested; the runner is driven against real `make` on small Makefiles whose recipes
record when they start and end, so the tests see the order and overlap the runner actually produced.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import maketest
from harness.maketest import Plan, Step

MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="make not installed")


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([], {}),
        (["integration=a,b"], {"integration": ("a", "b")}),
        (["integration=a", "integration=b", "e2e=c"], {"integration": ("a", "b"), "e2e": ("c",)}),
        (["e2e=a,,c"], {"e2e": ("a", "c")}),
        (["e2e=a b  c"], {"e2e": ("a", "b", "c")}),
    ],
)
def test_parse_needs(items: list[str], expected: dict[str, tuple[str, ...]]) -> None:
    assert maketest.parse_needs(items, ["integration", "e2e"], ["a", "b", "c"]) == expected


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("integration", "expected TIER=BUILD"),
        ("=a", "expected TIER=BUILD"),
        ("integration=", "expected TIER=BUILD"),
        ("lint=a", "'lint' is not one of the tiers (integration e2e)"),
        ("e2e=a,zz", "zz not among the builds (a b c)"),
    ],
)
def test_parse_needs_refuses(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        maketest.parse_needs([item], ["integration", "e2e"], ["a", "b", "c"])


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0.0s"), (9.94, "9.9s"), (59.9, "59.9s"), (60, "1m00s"), (1384.4, "23m04s")]
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert maketest.format_seconds(seconds) == text


@pytest.mark.parametrize(
    ("steps", "rc"),
    [
        ([Step("tier", "a", 1, 0), Step("build", "b", 1, 0)], 0),
        ([Step("tier", "a", 1, 2), Step("tier", "b", 0, None), Step("build", "c", 1, -1)], 2),
        ([Step("tier", "a", 1, 0), Step("build", "c", 1, 3), Step("build", "d", 0, None)], 3),
        # a build the runner stopped, with no failure named: still not a pass
        ([Step("tier", "a", 1, 0), Step("build", "c", 1, -1)], 1),
        ([Step("tier", "a", 1, 0), Step("tier", "b", 0, None)], 1),
        ([Step("wait", "a (for b)", 1, 0), Step("tier", "a", 1, 0)], 0),
    ],
)
def test_exit_status(steps: list[Step], rc: int) -> None:
    assert maketest.exit_status(steps) == rc


def test_summary_lists_every_step_with_its_time_and_outcome() -> None:
    steps = [
        Step("tier", "lint", 41.04, 0),
        Step("wait", "integration (for keda-client)", 12.0, 0),
        Step("tier", "integration", 240.0, 2),
        Step("tier", "e2e", 0.0, None),
        Step("setup", "deps", 3.0, 0),
        Step("build", "keda-client", 95.0, 0),
        Step("build", "testbed", 30.0, -1),
    ]
    lines = maketest.summary(steps, 400.0).splitlines()
    body = [" ".join(line.split()) for line in lines[1:]]
    assert body == [
        "setup deps 3.0s ok",
        "build keda-client 1m35s ok",
        "build testbed 30.0s stopped",
        "wait integration (for keda-client) 12.0s ok",
        "tier lint 41.0s ok",
        "tier integration 4m00s FAILED (exit 2)",
        "tier e2e 0.0s not run",
        "builds 2m05s (sum, background)",
        "total 6m40s",
    ]


def write_makefile(tmp_path: Path, body: str) -> Path:
    (tmp_path / "Makefile").write_text(body.replace("\n    ", "\n\t"))
    return tmp_path


def events(tmp_path: Path) -> list[str]:
    path = tmp_path / "events"
    return path.read_text().split() if path.exists() else []


# Each recipe appends "<target>+" when it starts and "<target>-" when it ends; builds sleep in between.
RECIPES = """
b1:
    echo b1+ >> events; sleep 0.3; touch b1.out; echo b1- >> events
b2:
    echo b2+ >> events; sleep 0.3; touch b2.out; echo b2- >> events
t1:
    echo t1+ >> events; test -f b1.out; echo t1- >> events
t2:
    echo t2+ >> events; test -f b2.out; echo t2- >> events
bad-build:
    echo bad-build+ >> events; echo 'the compiler said: boom' ; exit 3
slow-build:
    echo slow-build+ >> events; sleep 47.25; echo slow-build- >> events
bad-tier:
    echo bad-tier+ >> events; exit 5
setup:
    echo setup+ >> events
bad-setup:
    exit 4
"""


def run(tmp_path: Path, plan: Plan) -> tuple[int, str]:
    out = io.StringIO()
    assert MAKE is not None
    rc = maketest.run(plan, [MAKE, "-s"], write_makefile(tmp_path, RECIPES), tmp_path / "logs", out)
    return rc, out.getvalue()


@needs_make
def test_builds_run_one_at_a_time_and_tiers_wait_for_what_they_need(tmp_path: Path) -> None:
    plan = Plan(("setup",), ("b1", "b2"), ("t1", "t2"), {"t1": ("b1",), "t2": ("b2",)})
    rc, out = run(tmp_path, plan)
    assert rc == 0, out
    got = events(tmp_path)
    assert got[0] == "setup+"
    # the builds never overlap, and each tier starts only after the build it needs ended
    assert got.index("b1-") < got.index("b2+")
    assert got.index("b1-") < got.index("t1+")
    assert got.index("b2-") < got.index("t2+")
    assert (tmp_path / "logs" / "b1.log").exists() and (tmp_path / "logs" / "b2.log").exists()
    assert "make test: all tiers passed" in out
    table = [" ".join(line.split()[:3]) for line in out.splitlines() if line.startswith("  ")]
    assert "build b1" in " | ".join(table) and "tier t2" in " | ".join(table)
    assert any(line.split()[:2] == ["wait", "t1"] for line in out.splitlines())


@needs_make
def test_a_failed_build_fails_the_run_with_its_log_shown(tmp_path: Path) -> None:
    plan = Plan((), ("bad-build", "b2"), ("t1", "t2"), {"t2": ("b2",)})
    rc, out = run(tmp_path, plan)
    assert rc == 2  # make's status for a failed recipe, passed on
    assert "building bad-build FAILED" in out
    assert "the compiler said: boom" in out  # the build log's tail
    assert "b2+" not in events(tmp_path)  # the queue stops at the failure
    assert "t2+" not in events(tmp_path)  # the tier that needed the queue never started
    assert "make test: FAILED (exit 2)" in out


@needs_make
def test_a_failed_tier_stops_the_builds_and_keeps_its_status(tmp_path: Path) -> None:
    plan = Plan((), ("slow-build", "b2"), ("bad-tier", "t2"), {"t2": ("b2",)})
    t0 = time.monotonic()
    rc, out = run(tmp_path, plan)
    assert time.monotonic() - t0 < 30  # the 47 s build was stopped, not waited for
    assert rc == 2
    got = events(tmp_path)
    assert "slow-build-" not in got and "b2+" not in got and "t2+" not in got
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert any(line.startswith("build slow-build") and line.endswith("stopped") for line in lines)
    assert any(line.startswith("tier bad-tier") and line.endswith("FAILED (exit 2)") for line in lines)
    assert any(line.startswith("tier t2") and line.endswith("not run") for line in lines)
    # no process of the stopped build is left behind
    assert subprocess.run(["pgrep", "-f", "sleep 47.25"], capture_output=True).returncode != 0


@needs_make
def test_a_failed_setup_starts_no_build(tmp_path: Path) -> None:
    rc, out = run(tmp_path, Plan(("bad-setup",), ("b1",), ("t1",), {"t1": ("b1",)}))
    assert rc == 2
    assert events(tmp_path) == []
    assert "make test: FAILED (exit 2)" in out


@needs_make
def test_the_command_line_runs_make_test_the_way_the_makefile_does(tmp_path: Path) -> None:
    write_makefile(tmp_path, RECIPES)
    root = Path(__file__).resolve().parents[2]
    args = ["--builds", "b1 b2", "--tiers", "t1 t2", "--needs", "t1=b1", "--needs", "t2=b2", "--logs", "ci"]
    done = subprocess.run(
        [sys.executable, "-m", "harness.maketest", *args],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "MAKE": f"{MAKE} -s"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "ci" / "b2.log").exists()
    assert "make test: all tiers passed" in done.stdout

    bad = subprocess.run(
        [sys.executable, "-m", "harness.maketest", "--builds", "b1", "--tiers", "t1", "--needs", "t1=b9"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "b9 not among the builds (b1)" in bad.stderr
