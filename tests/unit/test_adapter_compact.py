"""adapter.compact: equal values come back as one object, and no value changes."""

from __future__ import annotations

import pytest

from adapter import compact
from adapter.provider import values_by_object
from gpuwarden.promtypes import Sample


@pytest.mark.parametrize(
    ("stamps", "shared_with_first"),
    [
        pytest.param([1764763200.0, 1764763200.0, 1764763200.0], [True, True, True], id="one-instant"),
        pytest.param([1.5, 2.5, 2.5], [True, False, False], id="a-new-run-starts-a-new-float"),
    ],
)
def test_stamps_share_equal_runs(stamps: list[float], shared_with_first: list[bool]) -> None:
    shared = compact.Stamps()
    # float(str(x)) makes distinct objects of equal value, as json decoding does
    out = [shared.shared(float(str(t))) for t in stamps]
    assert out == stamps
    assert [o is out[0] for o in out] == shared_with_first


def test_cached_values_hold_interned_names_and_one_stamp() -> None:
    pod = compact.name("app-0001-000")
    samples = [
        Sample({"pod": "".join(["app-0001-", "000"])}, float(str(1764763200.0)), 1.0),
        Sample({"pod": "".join(["app-0001-", "001"])}, float(str(1764763200.0)), 2.0),
    ]
    values = values_by_object(samples, "pod")
    assert values == {"app-0001-000": (1.0, 1764763200.0), "app-0001-001": (2.0, 1764763200.0)}
    assert next(iter(values)) is pod
    first, second = values.values()
    assert first[1] is second[1]
