"""Self-metrics conventions: build_info, snapshot collectors forget vanished label sets."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from gpuwarden import __version__
from gpuwarden.selfmetrics import SnapshotCollector, new_registry


def test_build_info_is_one_with_version() -> None:
    reg = new_registry("adapter")
    value = reg.get_sample_value(
        "gpuwarden_build_info",
        {
            "version": __version__,
            "python_version": pytest.importorskip("platform").python_version(),
            "component": "adapter",
        },
    )
    assert value == 1.0


def test_snapshot_collector_drops_stale_label_sets() -> None:
    reg = new_registry("controller")
    state: dict[tuple[str, ...], float] = {("node-a",): 1.0, ("node-b",): 1.0}
    reg.register(
        SnapshotCollector("gpuwarden_quarantined", "Quarantined nodes.", ["node"], lambda: dict(state))
    )
    assert b'gpuwarden_quarantined{node="node-b"} 1.0' in generate_latest(reg)
    del state[("node-b",)]
    text = generate_latest(reg)
    assert b'node="node-b"' not in text
    assert b'gpuwarden_quarantined{node="node-a"} 1.0' in text


def test_snapshot_collector_enforces_prefix() -> None:
    with pytest.raises(ValueError, match="gpuwarden_"):
        SnapshotCollector("quarantined", "x", [], dict)
