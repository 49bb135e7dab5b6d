"""Whether a bind can still finish before kube-scheduler gives up on it: deadlines and shedding.

Why it exists: kube-scheduler waits `httpTimeout` for a bind and then retries the pod. A bind still running
after that is work nobody waits for; worse, its retry arrives while it runs, and under load every retried
bind makes the queue in front of the API server longer, so more binds pass the timeout (issue 47: a slow
machine, 2,083 binds for 1,000 pods). Three rules keep binds inside the scheduler's patience:

* each bind carries a deadline (`deadline_of`): past it, the binder cancels it before its next write and
  frees its GPUs, so a Binding is never posted after the scheduler stopped waiting;
* a retried bind of a pod whose bind is still running joins that bind instead of starting a second
  (`Binder.bind`);
* a bind that cannot finish in time at the rate binds finish now is refused at once (`admit`), with an
  Error the scheduler retries, instead of joining a queue it would leave only after the deadline.

This module holds the decisions (pure, table-tested) and the small rate meter they read; it does no I/O.
"""

from __future__ import annotations

from collections import deque

DEADLINE_SHARE = 0.9
"""The share of the scheduler's httpTimeout a bind may use: the rest is for the Binding POST that started
just before the deadline and for the answer to travel back."""
FLOOR = 8
"""Binds always admitted, whatever the meter says (it is noisy while the first binds of a burst run)."""
CAP = 512
"""Binds admitted at most while the rate is not known yet (a busy period's first binds)."""
WINDOW_SECONDS = 5.0
"""How far back `BindRate` counts finished binds."""
MIN_SPAN = 0.2
"""The shortest time `BindRate` measures a rate over (less: None, the rate is not known yet)."""


def deadline_of(arrived: float, http_timeout: float) -> float:
    """When a bind that arrived at `arrived` (monotonic seconds) must have posted its Binding."""
    return arrived + http_timeout * DEADLINE_SHARE


def admit(inflight: int, rate: float | None, budget: float, floor: int = FLOOR, cap: int = CAP) -> bool:
    """Whether one more bind, behind `inflight` running ones, finishes within `budget` seconds when binds
    finish at `rate` per second (Little's law: the wait is the queue over the rate). `rate` None: nothing
    finished yet since binds started running, so nothing is known but the cap."""
    if inflight < floor:
        return True
    if rate is None:
        return inflight < cap
    if rate <= 0 or budget <= 0:
        return False
    return (inflight + 1) / rate <= budget


class BindRate:
    """Binds finished per second, measured from the first bind that finished in the current busy period
    (binds running without a pause) over at most the last `window` seconds. From the first finish, not
    the first start: while a burst's first binds are still on their way every rate measured from its start
    is too low, and a meter that says "slow" then sheds the burst it is meant to let through. Times are the
    caller's monotonic seconds, passed in so tests control them."""

    def __init__(self, window: float = WINDOW_SECONDS, min_span: float = MIN_SPAN) -> None:
        self._window = window
        self._min_span = min_span
        self._done: deque[float] = deque()
        self._first: float | None = None
        """When the first bind of the busy period finished (None: none yet)."""

    def _trim(self, now: float) -> None:
        while self._done and self._done[0] <= now - self._window:
            self._done.popleft()

    def started(self, now: float, running: int) -> None:
        """A bind started with `running` others running: with none, a busy period begins."""
        if running == 0:
            self._first = None

    def finished(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._done.append(now)
        self._trim(now)

    def rate(self, now: float) -> float | None:
        """Binds finished per second since the busy period's first finish (within the window), or None
        while that is less than `min_span` ago: too short to say."""
        self._trim(now)
        if self._first is None:
            return None
        since = max(self._first, now - self._window)
        span = now - since
        if span < self._min_span:
            return None
        return sum(1 for t in self._done if t > since) / span
