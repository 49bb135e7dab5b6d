"""Property test: any label value, however hostile, reaches a REAL Prometheus as a literal and nothing more.

Series carrying random label values (quotes, backslashes, newlines, regex metacharacters, PromQL syntax,
non-ASCII) are backfilled with promtool; for each value the equality matcher built by `promql.quote` and the
regex matcher built by `promql.literal_alternation` must select exactly that one series, and an alternation
of several values exactly those. The generator is seeded, so a failure names a reproducible value.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from adapter import promql
from gpuwarden.promtypes import Vector
from harness.localprom import LocalPrometheus, backfill_openmetrics

pytestmark = pytest.mark.asyncio(loop_scope="module")

SEED = 20261129
COUNT = 60
ALPHABET = "abcXYZ019 _-./:\"'\\\n\t.*+?()[]{}|^$=~!,#%&@`<>;\u00e9\u65e5\u672c\U0001f642\u200b"
HOSTILE = ['"} or vector(1) #', "\\", '\\"', ".*", "a|b", "x\\ny", "$1", "(?i)A", "\n", "}", '"', "'"]


def values() -> list[str]:
    rng = random.Random(SEED)
    out = list(HOSTILE)
    while len(out) < COUNT:
        candidate = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 16)))
        if candidate not in out:
            out.append(candidate)
    return out


def om_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def probe(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[LocalPrometheus, int]]:
    workdir = tmp_path_factory.mktemp("escaping")
    t = (int(time.time()) // 3600 - 4) * 3600
    lines = ["# TYPE escape_probe gauge"]
    lines += [f'escape_probe{{id="{i}",v="{om_escape(v)}"}} {i} {t}' for i, v in enumerate(values())]
    backfill_openmetrics(workdir, "\n".join(lines) + "\n# EOF\n")
    async with LocalPrometheus(workdir) as prom:
        yield prom, t


async def ids(prom: LocalPrometheus, t: int, matcher: str) -> list[str]:
    async with prom.client(retries=0) as client:
        result = await client.query(f"escape_probe{{{matcher}}}", time=t)
    assert isinstance(result, Vector)
    return sorted(s.labels["id"] for s in result.samples)


@pytest.mark.parametrize("index", range(COUNT))
async def test_value_round_trips_as_literal(probe: tuple[LocalPrometheus, int], index: int) -> None:
    prom, t = probe
    value = values()[index]
    assert await ids(prom, t, f"v={promql.quote(value)}") == [str(index)], repr(value)
    assert await ids(prom, t, promql.label_matcher("v", "=~", promql.regex_escape(value))) == [str(index)]


async def test_alternation_selects_exactly_the_listed_values(probe: tuple[LocalPrometheus, int]) -> None:
    prom, t = probe
    chosen = random.Random(SEED + 1).sample(range(COUNT), 7)
    matcher = promql.label_matcher("v", "=~", promql.literal_alternation(values()[i] for i in chosen))
    assert await ids(prom, t, matcher) == sorted(str(i) for i in chosen)
    negated = promql.label_matcher("v", "!~", promql.literal_alternation(values()[i] for i in chosen))
    assert len(await ids(prom, t, negated)) == COUNT - len(chosen)
