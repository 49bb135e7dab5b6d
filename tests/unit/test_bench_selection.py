"""`python -m tests.bench NAME`: an exact benchmark name runs that one only, other text every name with it."""

from __future__ import annotations

import pytest

from tests.bench.__main__ import _modules


@pytest.mark.parametrize(
    ("selected", "expected"),
    [
        (["keda"], ["bench_keda"]),  # not bench_keda_operator too
        (["bench_keda"], ["bench_keda"]),
        (["keda_operator"], ["bench_keda_operator"]),
        (["adapter"], ["bench_adapter"]),
        (["health"], ["bench_health"]),
        (["preempt"], ["bench_gpu_preemption", "bench_preemption"]),  # not a name: every name holding it
        (["upstream"], ["bench_adapter_upstream", "bench_resource_upstream"]),
        (["keda", "upstream"], ["bench_adapter_upstream", "bench_keda", "bench_resource_upstream"]),
        (["no-such-bench"], []),
    ],
)
def test_selection(selected: list[str], expected: list[str]) -> None:
    assert _modules(selected) == expected


def test_nothing_selected_runs_every_benchmark() -> None:
    names = _modules([])
    assert "bench_keda" in names and "bench_keda_operator" in names and names == sorted(names)
