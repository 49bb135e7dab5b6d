"""`make bench`: run every `tests/bench/bench_*.py` module's `main()` in turn and print its numbers.

Benchmarks print numbers; they never assert on time. Select some with `python -m tests.bench NAME ...`
(e.g. `simulator`). Each benchmark bounds its own loops and talks only to loopback.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import sys
import time
from pathlib import Path


def _modules(selected: list[str]) -> list[str]:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    if selected:
        names = [n for n in names if any(s in n for s in selected)]
    return names


def main(argv: list[str]) -> int:
    names = _modules(argv)
    if not names:
        print(f"no benchmark matches {argv}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(f"tests.bench.{name}")
        try:
            result = module.main()
            if inspect.iscoroutine(result):
                asyncio.run(result)
        except Exception as exc:  # a broken benchmark is reported, the others still run
            print(f"!!! {name} failed: {exc!r}", flush=True)
            failed.append(name)
        print(f"--- {name}: {time.perf_counter() - start:.1f}s", flush=True)
    if failed:
        print(f"\nfailed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
