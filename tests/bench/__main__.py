"""`make bench`: run every `tests/bench/bench_*.py` module's `main()` in turn and print its numbers.

Benchmarks print numbers; they never assert on time. Select some with `python -m tests.bench NAME ...`
(e.g. `simulator`; an exact name such as `keda` runs that one only, other text every name holding it). Each
benchmark bounds its own loops and talks only to loopback. The run ends with one summary table of what the
benchmarks recorded (`tests.bench.summary`): printed, and written as Markdown with the date and the machine
to `.cache/bench/summary.md` for the README.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pkgutil
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.bench import summary

SUMMARY_MD = Path(__file__).resolve().parents[2] / ".cache" / "bench" / "summary.md"
SUMMARY_ALL_MD = SUMMARY_MD.with_name("summary-all.md")
"""Every benchmark's latest rows (this run's and earlier runs'), for the README's whole-picture table."""
SUMMARY_RUNS = SUMMARY_MD.with_name("summary-runs.json")


def _modules(selected: list[str]) -> list[str]:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    if selected:
        # an exact name (`keda`, `bench_keda`) selects that one only; other text, every name holding it
        exact = {f"bench_{s.removeprefix('bench_')}" for s in selected} & set(names)
        loose = [s for s in selected if f"bench_{s.removeprefix('bench_')}" not in exact]
        names = [n for n in names if n in exact or any(s in n for s in loose)]
    return names


def _memory_bytes() -> int | None:
    """MemTotal from /proc/meminfo; None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _write_summary(names: list[str]) -> None:
    """Print the run's summary table and write its Markdown version with the date and machine."""
    rows = summary.COLLECTOR.rows
    print("\n=== summary ===", flush=True)
    print(summary.render_text(rows), flush=True)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = summary.machine_line(date, platform.machine(), os.cpu_count(), _memory_bytes())
    heading = [f"`make bench` summary, {machine} (benchmarks run: {', '.join(names)})"]
    try:
        SUMMARY_MD.parent.mkdir(parents=True, exist_ok=True)
        SUMMARY_MD.write_text(summary.render_markdown(rows, heading))
        previous = summary.decode_runs(SUMMARY_RUNS.read_text()) if SUMMARY_RUNS.exists() else {}
        runs = summary.merge_runs(previous, rows, machine)
        SUMMARY_RUNS.write_text(summary.encode_runs(runs))
        SUMMARY_ALL_MD.write_text(
            summary.render_all(runs, "`make bench` summary, every benchmark's latest run")
        )
    except OSError as exc:
        print(f"summary not written to {SUMMARY_MD}: {exc!r}", file=sys.stderr)
        return
    print(
        f"(Markdown for the README: {SUMMARY_MD}; every benchmark's latest rows: {SUMMARY_ALL_MD})",
        flush=True,
    )


def main(argv: list[str]) -> int:
    names = _modules(argv)
    if not names:
        print(f"no benchmark matches {argv}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        bench = name.removeprefix("bench_")
        try:
            module = importlib.import_module(f"tests.bench.{name}")
            result = module.main()
            if inspect.iscoroutine(result):
                asyncio.run(result)
        except Exception as exc:  # a broken benchmark is reported, the others still run
            print(f"!!! {name} failed: {exc!r}", flush=True)
            failed.append(name)
            summary.record_failure(bench, repr(exc))
        else:
            if bench not in summary.COLLECTOR.benches():
                summary.record(bench, "ran, recorded no summary row", None, "")
        print(f"--- {name}: {time.perf_counter() - start:.1f}s", flush=True)
    _write_summary(names)
    if failed:
        print(f"\nfailed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
