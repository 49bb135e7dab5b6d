"""`python -m gpuwarden.demo [--scenario FILE] [--keep] [--out DIR]`: the demo without the CLI wiring.

Why: `gpuwarden demo` is the documented entry point; this exists so the demo can be run (and the e2e test
can run it as a subprocess) with the same arguments before and independently of the CLI's wiring.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuwarden.demo.runner import run_demo


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwarden.demo")
    parser.add_argument("--scenario", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", type=Path, help="report folder (default: ./demo-report-<timestamp>)")
    args = parser.parse_args()
    return run_demo(args.scenario, args.out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
