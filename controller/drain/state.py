"""The `gpuwarden.io/drain` node annotation: a drain's progress, kept on the Node it concerns.

Why it exists: docs/architecture.md safety rule 5 — a restarted or new leader continues a drain where the last
one stopped, and `kubectl describe node` shows it: when it started, its scope, which pods are still to move,
which are blocked and by what (a PodDisruptionBudget's 429), when it was done, and the eviction ledger (the
last minute's evictions, each written before its Eviction is sent, and whether its Event was written). A
drain cancelled by a release leaves only its ledger (and when it was cancelled) until the ledger is pruned.
The per-pod retry history is what the plan's back-off and `delete_after_seconds` deadlines are computed from.
Pure: encode/decode only, no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.drain.plan import Eviction, PodHistory
from gpuwarden.quarantine import iso, parse_iso
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION


@dataclass(frozen=True, slots=True)
class DrainState:
    started: float
    scope: str = "gpu"
    pending: tuple[str, ...] = ()
    blocked: Mapping[str, str] = field(default_factory=dict)
    history: Mapping[str, PodHistory] = field(default_factory=dict)
    done: float | None = None
    evictions: tuple[Eviction, ...] = ()
    """The eviction ledger: the last minute's evictions (the fleet rate) and Events still owed."""
    cancelled: float | None = None
    """When the drain was cancelled (the node released): only the ledger is left, kept until pruned, and a
    new quarantine's drain starts afresh with it (cancel.py)."""

    def with_(self, **changes: Any) -> DrainState:
        return replace(self, **changes)

    def encode(self) -> str:
        body: dict[str, Any] = {
            "version": 1,
            "started": iso(self.started),
            "scope": self.scope,
            "pending": sorted(self.pending),
            "blocked": dict(sorted(self.blocked.items())),
            "history": {
                key: {
                    k: v
                    for k, v in (
                        ("first_refused", iso(h.first_refused)),
                        ("last_attempt", iso(h.last_attempt)),
                        ("attempts", h.attempts),
                    )
                    if v is not None
                }
                for key, h in sorted(self.history.items())
            },
        }
        if self.done is not None:
            body["done"] = iso(self.done)
        if self.cancelled is not None:
            body["cancelled"] = iso(self.cancelled)
        if self.evictions:
            body["evictions"] = [
                {"pod": e.pod, "uid": e.uid, "at": iso(e.at), **({} if e.evented else {"event": "pending"})}
                for e in self.evictions
            ]
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def decode(text: str | None) -> tuple[DrainState | None, str]:
    """(state, "") or (None, why it could not be read); an absent annotation is (None, "")."""
    if not text:
        return None, ""
    try:
        raw = json.loads(text)
        started = parse_iso(raw["started"])
        if started is None:
            raise ValueError("started is null")
        history = {
            str(key): PodHistory(
                first_refused=parse_iso(h.get("first_refused")),
                last_attempt=parse_iso(h.get("last_attempt")),
                attempts=int(h.get("attempts", 0)),
            )
            for key, h in (raw.get("history") or {}).items()
        }
        return (
            DrainState(
                started=started,
                scope=str(raw.get("scope", "gpu")),
                pending=tuple(str(p) for p in raw.get("pending") or ()),
                blocked={str(k): str(v) for k, v in (raw.get("blocked") or {}).items()},
                history=history,
                done=parse_iso(raw.get("done")),
                cancelled=parse_iso(raw.get("cancelled")),
                evictions=tuple(
                    Eviction(
                        str(e["pod"]),
                        str(e["uid"]),
                        float(parse_iso(e["at"]) or 0.0),
                        e.get("event") != "pending",
                    )
                    for e in raw.get("evictions") or ()
                ),
            ),
            "",
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{DRAIN_ANNOTATION} unreadable: {exc}"
