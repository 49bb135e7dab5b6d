"""An API stand-in for the preemption throttle's one write (the preemption record on the preemptor)."""

from __future__ import annotations

import copy
from typing import Any

from gpuwarden.errors import KubeError
from gpuwarden.kube.resources import Resource


class RecordSink:
    """Takes `patch` calls and keeps them (`patches`: (namespace, name, body)); `fail` makes them raise."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Any]] = []
        self.fail: KubeError | None = None

    async def patch(self, resource: Resource, name: str, body: Any, **kw: Any) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.patches.append((str(kw.get("namespace", "")), name, copy.deepcopy(body)))
        return {}
