"""Debounce: a signal counts only after it held for N evaluations in a row on the same GPU (or node).

Why: boot-time link training, a single odd sample or a one-pass power brake are not faults. NVSentinel fixed
`NVLINK_DOWN` firing on every GB200 boot (214 of 288 nodes in 3.5 weeks, #1701) with N-consecutive-poll
debounce (PR #1715); its power-brake watch needs 3 consecutive polls (PR #1668). One streak per key
`<node>/<signal>/<gpu>` counts the consecutive evaluations in which the signal held.

The streaks are carried between passes in the controller's memory (`FleetSnapshot.streaks` in,
`HealthPlan.streaks` out). Losing them (restart, new leader) only restarts the count: the action comes N
passes later, never earlier, so nothing unsafe follows from not persisting them.

What it must not do: no I/O, no clock reads (`now` is passed in). A node that could not be evaluated this
pass (unknown telemetry) keeps its streaks as they were: unknown neither confirms nor clears a signal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.health.snapshot import Streak


def streak_key(node: str, signal: str, gpu: str) -> str:
    return f"{node}/{signal}/{gpu}"


def key_node(key: str) -> str:
    return key.split("/", 1)[0]


def advance(
    previous: Mapping[str, Streak], held: Iterable[str], evaluated: set[str], now: float
) -> dict[str, Streak]:
    """The streaks after one pass.

    `held`: keys whose signal held this pass; `evaluated`: nodes whose telemetry was known this pass. A held
    key extends its streak (or starts one at `now`); a key of an evaluated node that did not hold is dropped
    (the run is broken); a key of a node not evaluated is kept unchanged.
    """
    held_keys = set(held)
    out: dict[str, Streak] = {}
    for key in held_keys:
        prev = previous.get(key)
        out[key] = Streak(prev.count + 1, prev.since) if prev is not None else Streak(1, now)
    for key, streak in previous.items():
        if key not in held_keys and key_node(key) not in evaluated:
            out[key] = streak
    return out


def confirmed(streak: Streak | None, consecutive: int) -> bool:
    return streak is not None and streak.count >= consecutive
