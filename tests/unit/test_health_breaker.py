"""The circuit breaker alone: counts in, verdict out, at and around every boundary."""

from __future__ import annotations

import pytest

from controller.health.breaker import Budget, evaluate
from controller.health.snapshot import BreakerState

NOW = 10_000.0
CLOSED = BreakerState()
OPEN = BreakerState(True, NOW - 100, None, "trip")


@pytest.mark.parametrize(
    ("before", "budget", "demand", "after_open", "admit", "event"),
    [
        pytest.param(CLOSED, Budget(0, 3, 0, 5), 3, False, 3, None, id="closed-exactly-at-limit"),
        pytest.param(CLOSED, Budget(0, 3, 0, 5), 4, True, 3, "QuarantineBreakerOpen", id="closed-one-over"),
        pytest.param(CLOSED, Budget(3, 3, 0, 5), 1, True, 0, "QuarantineBreakerOpen", id="closed-full"),
        pytest.param(CLOSED, Budget(0, 10, 4, 5), 2, True, 1, "QuarantineBreakerOpen", id="new-per-window"),
        pytest.param(CLOSED, Budget(2, 3, 0, 5), 0, False, 0, None, id="closed-no-demand"),
        pytest.param(OPEN, Budget(0, 3, 0, 5), 1, True, 0, None, id="open-clear-timer-starts"),
        pytest.param(OPEN, Budget(0, 3, 0, 5), 9, True, 0, None, id="open-still-over"),
        pytest.param(
            BreakerState(True, NOW - 5000, NOW - 899, "t"),
            Budget(0, 3, 0, 5),
            1,
            True,
            0,
            None,
            id="open-hold-not-elapsed",
        ),
        pytest.param(
            BreakerState(True, NOW - 5000, NOW - 900, "t"),
            Budget(0, 3, 0, 5),
            1,
            False,
            1,
            "QuarantineBreakerClosed",
            id="open-hold-elapsed-closes",
        ),
        pytest.param(
            BreakerState(True, NOW - 5000, None, "t", reset_requested=True),
            Budget(0, 3, 0, 5),
            2,
            False,
            2,
            "QuarantineBreakerClosed",
            id="operator-reset",
        ),
        pytest.param(
            BreakerState(reset_requested=True), Budget(0, 3, 0, 5), 2, False, 2, None, id="reset-while-closed"
        ),
        pytest.param(
            BreakerState(True, NOW - 5000, None, "t", reset_requested=True),
            Budget(3, 3, 0, 5),
            1,
            True,
            0,
            "QuarantineBreakerOpen",
            id="reset-and-over-again",
        ),
    ],
)
def test_breaker(
    before: BreakerState, budget: Budget, demand: int, after_open: bool, admit: int, event: str | None
) -> None:
    v = evaluate(before, budget, demand, hold=900.0, now=NOW)
    assert (v.after.open, v.admit, v.event.reason if v.event else None) == (after_open, admit, event)


def test_clear_timer_resets_when_over_again() -> None:
    v = evaluate(BreakerState(True, 0.0, NOW - 300, "t"), Budget(3, 3, 0, 5), 1, hold=900.0, now=NOW)
    assert v.after.open and v.after.clear_since is None


def test_no_data_moves_nothing() -> None:
    v = evaluate(OPEN, Budget(0, 3, 0, 5), 0, hold=0.0, now=NOW, data_ok=False)
    assert v.after == OPEN and v.admit == 0
