"""``make test``'s runner: the tiers in order in the foreground, the builds started early in the background.

``make test`` used to run its tiers one after another, each building what it needed on the way in, so on a
cold machine ~22 min of Go builds (the test bed, Helm, KEDA, the KEDA client, the PromQL parser) sat in line
with lint, unit and integration, which mostly leave one of the two cores idle (issue 51). This runner:

1. runs the ``--setup`` targets in the foreground (the virtualenv and the Debian packages: apt and pip must
   not race the builds or each other);
2. starts the ``--builds`` targets in a background queue, **one at a time** (two Go builds on two cores are
   no faster than one after the other, and each needs gigabytes), each logging to ``<logs>/<build>.log``;
3. runs the ``--tiers`` targets in order in the foreground; a tier named in ``--needs tier=build,...`` first
   waits for those builds (so a tier's own prerequisites find them up to date and never build beside the
   queue);
4. stops at the first failure (a tier, or a build: its log's tail is printed), stops the queue, prints each
   step's wall time, and exits with the failing ``make``'s status.

Every target keeps its Makefile prerequisites, so ``make e2e`` alone still builds what it needs; the runner
only changes when the builds happen. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

Kind = Literal["setup", "build", "wait", "tier"]
TAIL_LINES = 40


@dataclass(frozen=True)
class Step:
    """One timed step: ``rc`` None when it never ran (the run failed before it), -1 when it was stopped."""

    kind: Kind
    name: str
    seconds: float
    rc: int | None


@dataclass(frozen=True)
class Plan:
    setup: tuple[str, ...]
    builds: tuple[str, ...]
    tiers: tuple[str, ...]
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict)


def parse_needs(
    items: Sequence[str], tiers: Sequence[str], builds: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """``["integration=promql-check,keda-client"]`` -> ``{"integration": ("promql-check", "keda-client")}``

    Builds are separated by commas or spaces (a Makefile's ``--needs "e2e=$(E2E_BUILDS)"``).
    """
    needs: dict[str, tuple[str, ...]] = {}
    for item in items:
        tier, sep, rest = item.partition("=")
        if not sep or not tier or not rest:
            raise ValueError(f"--needs {item!r}: expected TIER=BUILD[,BUILD...]")
        if tier not in tiers:
            raise ValueError(f"--needs {item!r}: {tier!r} is not one of the tiers ({' '.join(tiers)})")
        wanted = tuple(b for b in re.split(r"[,\s]+", rest) if b)
        unknown = [b for b in wanted if b not in builds]
        if unknown:
            raise ValueError(
                f"--needs {item!r}: {', '.join(unknown)} not among the builds ({' '.join(builds)})"
            )
        needs[tier] = needs.get(tier, ()) + wanted
    return needs


def outcome(rc: int | None) -> str:
    if rc is None:
        return "not run"
    if rc == -1:
        return "stopped"
    return "ok" if rc == 0 else f"FAILED (exit {rc})"


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def summary(steps: Sequence[Step], total: float) -> str:
    """The table printed at the end: builds (background, overlapping the tiers), then the foreground steps."""
    width = max([len(s.name) for s in steps] + [5])
    lines = ["make test: wall time per step (builds ran in the background, one at a time, beside the tiers)"]
    order: tuple[Kind, ...] = ("setup", "build", "wait", "tier")
    for kind in order:
        for s in steps:
            if s.kind == kind:
                lines.append(
                    f"  {kind:<5}  {s.name:<{width}}  {format_seconds(s.seconds):>8}  {outcome(s.rc)}"
                )
    builds = sum(s.seconds for s in steps if s.kind == "build")
    lines.append(f"  {'':<5}  {'builds':<{width}}  {format_seconds(builds):>8}  (sum, background)")
    lines.append(f"  {'':<5}  {'total':<{width}}  {format_seconds(total):>8}")
    return "\n".join(lines)


def exit_status(steps: Sequence[Step]) -> int:
    """The first failed step's status (a tier's or a build's), 0 when every step that ran passed."""
    for s in steps:
        if s.rc is not None and s.rc > 0:
            return s.rc
    if any(s.rc == -1 or s.rc is None for s in steps if s.kind != "wait"):
        return 1
    return 0


class BuildQueue:
    """The background builds, one ``make <build>`` at a time, in order, each logged to its own file."""

    def __init__(self, make: Sequence[str], builds: Sequence[str], logs: Path, cwd: Path) -> None:
        self._make, self._builds, self._logs, self._cwd = list(make), list(builds), logs, cwd
        self._done = {b: threading.Event() for b in builds}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self.results: dict[str, Step] = {}
        self._thread = threading.Thread(target=self._run, name="build-queue", daemon=True)

    def log(self, build: str) -> Path:
        return self._logs / f"{build}.log"

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._logs.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def _run(self) -> None:
        failed = False
        for build in self._builds:
            with self._lock:
                if failed or self._stopping:
                    self.results[build] = Step("build", build, 0.0, None)
                    self._done[build].set()
                    continue
                t0 = time.monotonic()
                with self.log(build).open("wb") as out:
                    self._proc = subprocess.Popen(
                        [*self._make, build],
                        cwd=self._cwd,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                proc = self._proc
            rc = proc.wait()
            with self._lock:
                self._proc = None
                stopped = self._stopping and rc != 0
                self.results[build] = Step("build", build, time.monotonic() - t0, -1 if stopped else rc)
                failed = rc != 0
            self._done[build].set()

    def failed(self) -> str | None:
        """The first build that failed so far (not one this runner stopped)."""
        for build in self._builds:
            step = self.results.get(build)
            if step is not None and step.rc is not None and step.rc > 0:
                return build
        return None

    def wait(self, build: str) -> Step:
        self._done[build].wait()
        return self.results[build]

    def stop(self) -> None:
        """Stop the running build (its whole process group) and skip the rest."""
        with self._lock:
            self._stopping = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self._thread.join()

    def steps(self) -> list[Step]:
        return [self.results.get(b, Step("build", b, 0.0, None)) for b in self._builds]


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(text.splitlines()[-lines:])


def run(plan: Plan, make: Sequence[str], cwd: Path, logs: Path, out: TextIO) -> int:
    t_all = time.monotonic()
    steps: list[Step] = []

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    def foreground(kind: Kind, target: Sequence[str], name: str) -> int:
        t0 = time.monotonic()
        rc = subprocess.call([*make, *target], cwd=cwd)
        steps.append(Step(kind, name, time.monotonic() - t0, rc))
        return rc

    queue = BuildQueue(make, plan.builds, logs, cwd)
    failed_build: str | None = None
    try:
        if plan.setup and foreground("setup", plan.setup, " ".join(plan.setup)) != 0:
            steps.extend(Step("tier", t, 0.0, None) for t in plan.tiers)
            return finish(steps, queue, None, t_all, say, started=False)
        if plan.builds:
            say(
                f"==> make test: building {' '.join(plan.builds)} in the background, one at a time "
                f"(logs: {logs}/<build>.log)"
            )
        queue.start()
        for i, tier in enumerate(plan.tiers):
            failed_build = queue.failed()
            needs = plan.needs.get(tier, ())
            if failed_build is None and needs:
                pending = [b for b in needs if b not in queue.results]
                t0 = time.monotonic()
                if pending:
                    say(f"==> make test: {tier} waits for {', '.join(pending)}")
                for build in needs:
                    queue.wait(build)
                # a needed build skipped after an earlier build failed counts as that failure
                failed_build = queue.failed()
                if pending:
                    steps.append(Step("wait", f"{tier} (for {', '.join(pending)})", time.monotonic() - t0, 0))
            if failed_build is not None:
                steps.extend(Step("tier", t, 0.0, None) for t in plan.tiers[i:])
                break
            if foreground("tier", (tier,), tier) != 0:
                steps.extend(Step("tier", t, 0.0, None) for t in plan.tiers[i + 1 :])
                break
        return finish(steps, queue, failed_build, t_all, say, started=True)
    except BaseException:  # Ctrl-C, or SIGTERM (CI's timeout) turned into SystemExit by main()
        if queue.started:
            queue.stop()
        raise


def finish(
    steps: list[Step],
    queue: BuildQueue,
    failed_build: str | None,
    t_all: float,
    say: Callable[[str], None],
    started: bool,
) -> int:
    if started:
        if exit_status(steps) == 0 and failed_build is None:
            for build in queue.steps():
                queue.wait(build.name)  # every tier passed: the remaining builds must pass too
        queue.stop()
        failed_build = failed_build or queue.failed()
    all_steps = [*steps, *queue.steps()]
    if failed_build is not None:
        log = queue.log(failed_build)
        say(f"==> make test: building {failed_build} FAILED; the last {TAIL_LINES} lines of {log}:")
        say(tail(log))
    say(summary(all_steps, time.monotonic() - t_all))
    rc = exit_status(all_steps)
    say("make test: all tiers passed" if rc == 0 else f"make test: FAILED (exit {rc})")
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.maketest", description=__doc__.split("\n\n")[0])
    p.add_argument("--setup", default="", help="targets run first, in the foreground (space-separated)")
    p.add_argument("--builds", default="", help="targets built in the background, in order (space-separated)")
    p.add_argument("--tiers", required=True, help="targets run in order in the foreground (space-separated)")
    p.add_argument(
        "--needs",
        action="append",
        default=[],
        metavar="TIER=BUILD[,BUILD...]",
        help="builds a tier waits for before it starts (repeatable)",
    )
    p.add_argument("--logs", type=Path, default=Path(".cache/ci"), help="background builds' logs")
    p.add_argument("--make", default=os.environ.get("MAKE", "make"), help="the make command (default: $MAKE)")
    args = p.parse_args(argv)
    setup, builds, tiers = (tuple(str(v).split()) for v in (args.setup, args.builds, args.tiers))
    if not tiers:
        p.error("--tiers names no target")
    dup = sorted({b for b in builds if builds.count(b) > 1})
    if dup:
        p.error(f"--builds names {', '.join(dup)} twice")
    try:
        needs = parse_needs(args.needs, tiers, builds)
    except ValueError as e:
        p.error(str(e))
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    cwd = Path.cwd()
    logs = args.logs if args.logs.is_absolute() else cwd / args.logs
    return run(Plan(setup, builds, tiers, needs), args.make.split(), cwd, logs, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
