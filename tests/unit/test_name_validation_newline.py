"""Names and values validated with a regex refuse a trailing newline.

Python's `$` also matches before a final "\n", so `re.match(r"^[a-z]+$", "up\n")` accepts it; a label name
"A\n" then reached a PromQL query as a different name (found by tests/integration/test_promql_properties.py).
Every validator anchors with `\\Z`; this table holds each one to it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from adapter import promql, routing, selectors
from adapter.errors import BadRequest
from gpuwarden.config import fieldtypes
from nodeagent.topology import model, sysfs

VALID_AND_CHECK: list[tuple[str, Callable[[str], object]]] = [
    ("gpu", promql.check_label_name),
    ("gpu", fieldtypes._label_name),
    ("DCGM_FI_DEV_GPU_UTIL", fieldtypes._metric_name),
    ("nvidia.com/gpu", fieldtypes._qualified_name),
    ("inference", fieldtypes._dns_label),
    ("inference", routing._namespace),
    ("llm-serve-0", routing._object_name),
]


@pytest.mark.parametrize(("valid", "check"), VALID_AND_CHECK)
def test_a_trailing_newline_is_refused(valid: str, check: Callable[[str], object]) -> None:
    check(valid)  # the name itself passes
    with pytest.raises((ValueError, BadRequest)):
        check(valid + "\n")


@pytest.mark.parametrize(
    ("pattern", "valid"),
    [
        (selectors._NAME, "app"),
        (selectors._VALUE, "llm"),
        (selectors._DNS_SUBDOMAIN, "example.com"),
        (selectors._INTEGER, "42"),
        (model._BUS_ID, "00000000:18:00.0"),
        (sysfs._UUID, "GPU-1234abcd"),
    ],
)
def test_patterns_match_the_whole_text(pattern: object, valid: str) -> None:
    assert pattern.match(valid)  # type: ignore[attr-defined]
    assert not pattern.match(valid + "\n")  # type: ignore[attr-defined]
