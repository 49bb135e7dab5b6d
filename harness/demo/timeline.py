"""The demo's timeline: what happened when, printed as it happens and kept for the report.

Why it exists: a new user watching `make demo` must see at every moment what is being set up, what the
scenario just did and whether each expected outcome was observed — and the HTML report must show the same
story afterwards. So every line goes through one `Timeline`, which prints it (timestamped from the start of
the run, coloured on a TTY) and records it as an `Entry`; step outcomes are kept as `Outcome`s.

What it must not do: decide anything. It only records and prints.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Literal, TextIO

Kind = Literal["phase", "info", "action", "pass", "fail", "warn"]

_MARK: dict[Kind, str] = {
    "phase": "==>",
    "info": "   ",
    "action": " ->",
    "pass": "ok ",
    "fail": "FAIL",
    "warn": " ! ",
}
_COLOUR: dict[Kind, str] = {"phase": "1", "pass": "32", "fail": "1;31", "warn": "33", "action": "36"}


@dataclass(frozen=True)
class Entry:
    """One timeline line; `t` is seconds since the run started, `wall` the Unix time."""

    t: float
    wall: float
    kind: Kind
    text: str
    step: str = ""


@dataclass(frozen=True)
class Outcome:
    """The verdict on one expected outcome of one step."""

    step: str
    expectation: str
    passed: bool
    detail: str
    t: float
    took: float


@dataclass
class Timeline:
    """Prints and records; `stream` defaults to stdout, colour only when it is a terminal."""

    stream: TextIO = field(default_factory=lambda: sys.stdout)
    started: float = field(default_factory=time.monotonic)
    wall_start: float = field(default_factory=time.time)
    entries: list[Entry] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    step: str = ""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _emit(self, kind: Kind, text: str) -> Entry:
        entry = Entry(self.elapsed, time.time(), kind, text, self.step)
        self.entries.append(entry)
        mark = _MARK[kind]
        colour = _COLOUR.get(kind)
        if colour and getattr(self.stream, "isatty", lambda: False)():
            mark = f"\033[{colour}m{mark}\033[0m"
            if kind == "phase":
                text = f"\033[1m{text}\033[0m"
        print(f"[{_clock(entry.t)}] {mark:>4} {text}", file=self.stream, flush=True)
        return entry

    def phase(self, text: str, step: str = "") -> None:
        """A new phase (bring-up, a scenario step, the report)."""
        self.step = step
        self._emit("phase", text)

    def info(self, text: str) -> None:
        self._emit("info", text)

    def action(self, text: str) -> None:
        self._emit("action", text)

    def warn(self, text: str) -> None:
        self._emit("warn", text)

    def outcome(self, expectation: str, passed: bool, detail: str, took: float) -> Outcome:
        """Record and print the verdict on one expectation of the current step."""
        self._emit("pass" if passed else "fail", f"{expectation}: {detail}")
        result = Outcome(self.step, expectation, passed, detail, self.elapsed, took)
        self.outcomes.append(result)
        return result

    @property
    def passed(self) -> bool:
        """True when at least one outcome was checked and all of them passed."""
        return bool(self.outcomes) and all(o.passed for o in self.outcomes)

    def step_spans(self) -> list[tuple[str, float, float]]:
        """(step, first t, last t) for every step, in order; bring-up has the step name ""."""
        spans: dict[str, list[float]] = {}
        for e in self.entries:
            spans.setdefault(e.step, []).append(e.t)
        return [(name, min(ts), max(ts)) for name, ts in spans.items() if name]


def _clock(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes):02d}:{rest:04.1f}"
