"""Deadline-based polling for the test bed and the e2e tests.

Everything in a real control plane is eventually consistent (a controller sync, a kwok stage, an APIService
availability probe), so tests must wait for a condition with a deadline instead of sleeping a fixed time and
hoping. :func:`poll` is that one primitive; its timeout message carries the last observed value or error so a
failing e2e test says what it saw.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PollTimeoutError(TimeoutError):
    """The condition did not hold before the deadline."""


def poll(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns a truthy value and return it; raise after ``timeout`` seconds.

    Exceptions raised by ``probe`` count as "not yet" and are reported if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except Exception as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise PollTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}; last observed: {last!r}"
            )
        time.sleep(interval)


class Progress:
    """Timestamped progress lines on stderr (cluster bring-up is slow enough to deserve them)."""

    def __init__(self, prefix: str = "testbed", *, enabled: bool = True) -> None:
        self._prefix = prefix
        self._enabled = enabled
        self._start = time.monotonic()

    @property
    def elapsed(self) -> float:
        """Seconds since this object was created."""
        return time.monotonic() - self._start

    def __call__(self, message: str) -> None:
        """Print one progress line."""
        if self._enabled:
            print(f"[{self._prefix} +{self.elapsed:5.1f}s] {message}", file=sys.stderr, flush=True)
