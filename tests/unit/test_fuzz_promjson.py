"""Differential fuzzing: `gpuwarden.promjson.loads` against `json.loads(..., object_hook=sample_hook)`.

The promise of promjson (issue 44, P1): the same decoded answer, or a refusal - a `ValueError`, which
`promclient` maps to `PrometheusServerError` - where `json.loads` refuses too (its `RecursionError` on deep
nesting included). Documents are generated as Prometheus writes an instant vector (so the sliced path
runs), with the keys it may add after the items - repeated keys among them - and arbitrary JSON; then
mutated byte by byte (inserted, replaced and deleted bytes: broken UTF-8, surrogates, stray brackets).
Compared by `repr`, so a NaN equals a NaN. Derandomized: the same cases every run.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden import promjson
from gpuwarden.promtypes import sample_hook

SETTINGS: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "derandomize": True,
    "suppress_health_check": list(HealthCheck),
}
GENERATED_EXAMPLES = 400
MUTATED_EXAMPLES = 500

LABEL = st.lists(
    st.one_of(st.characters(codec="utf-8"), st.sampled_from(["\ud800", "\udfff"])), max_size=6
).map("".join)
"""Any text, lone surrogates too (`st.text` leaves them out): written raw (`ensure_ascii=False`) they are
bytes `json.loads` reads with `surrogatepass`."""
VALUE = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "1", "0.5", "1e3", "nan", "x", ""]),
    st.floats(allow_nan=False).map(repr),
)
TIMESTAMP = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(10**20), 10**20))
ITEM = st.one_of(
    st.fixed_dictionaries(
        {"metric": st.dictionaries(LABEL, LABEL, max_size=3), "value": st.tuples(TIMESTAMP, VALUE)}
    ),
    st.dictionaries(LABEL, st.integers(), max_size=2),  # an item sample_hook leaves as decoded
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | LABEL,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(LABEL, inner, max_size=3),
    max_leaves=8,
)
DEEP = st.sampled_from(["[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000])
"""Nested deeper than json.loads recurses (its RecursionError)."""
TAIL_VALUE = st.one_of(JSON.map(json.dumps), DEEP)
TAIL_KEY = st.sampled_from(["warnings", "infos", "result", "data", "status", "resultType", "x"])
SPACE = st.sampled_from(["", "", "", " ", "\n", "\t ", "\r\n"])


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    """An instant-vector answer in Prometheus' field order, with extra keys after the items."""
    items = draw(st.lists(ITEM, max_size=8))
    sep = draw(SPACE) + "," + draw(SPACE)
    body = sep.join(json.dumps(item, ensure_ascii=draw(st.booleans())) for item in items)
    if items and draw(st.integers(0, 9)) == 0:
        body += sep + draw(DEEP)
    inner = "".join(f',"{k}":{v}' for k, v in draw(st.lists(st.tuples(TAIL_KEY, TAIL_VALUE), max_size=2)))
    outer = "".join(f',"{k}":{v}' for k, v in draw(st.lists(st.tuples(TAIL_KEY, TAIL_VALUE), max_size=2)))
    text = (
        promjson.VECTOR_HEAD
        + draw(SPACE)
        + body
        + draw(SPACE)
        + "]"
        + inner
        + "}"
        + outer
        + "}"
        + draw(SPACE)
    )
    return text.encode("utf-8", "surrogatepass")


def decoded(content: bytes) -> Any:
    """`promjson.loads` driven by hand: its yields are bare `asyncio.sleep(0)`s, which need no event loop
    (an event loop per example would be most of the budget)."""
    coroutine = promjson.loads(content, large=0, slice_items=2)
    try:
        while True:
            coroutine.send(None)
    except StopIteration as done:
        return done.value


def same_as_json_loads(content: bytes) -> None:
    try:
        expected: Any = repr(json.loads(content, object_hook=sample_hook))
    except RecursionError:
        expected = promjson.TooDeep
    except ValueError:
        expected = ValueError
    try:
        got: Any = repr(decoded(content))
    except promjson.TooDeep:
        got = promjson.TooDeep
    except ValueError:
        got = ValueError
    assert got == expected


@settings(max_examples=GENERATED_EXAMPLES, **SETTINGS)
@given(answers())
def test_generated_answers_decode_as_json_loads_does(content: bytes) -> None:
    same_as_json_loads(content)


MUTATION = st.tuples(
    st.sampled_from(["insert", "replace", "delete"]),
    st.integers(0, 1 << 16),
    st.one_of(
        st.binary(min_size=1, max_size=3),
        st.sampled_from([b"\xed\xa0\x80", b"\xff", b"[" * 3000, b"]", b"}", b",", b'"', b"\\", b"NaN"]),
    ),
)


@settings(max_examples=MUTATED_EXAMPLES, **SETTINGS)
@given(answers(), st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_answers_decode_as_json_loads_does_or_are_refused(
    content: bytes, mutations: list[tuple[str, int, bytes]]
) -> None:
    data = bytearray(content)
    for kind, at, chunk in mutations:
        at %= len(data) + 1
        if kind == "insert":
            data[at:at] = chunk
        elif kind == "replace":
            data[at : at + len(chunk)] = chunk
        else:
            del data[at : at + len(chunk)]
    same_as_json_loads(bytes(data))
