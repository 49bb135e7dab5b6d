"""gpuwarden.promjson: a large vector decoded a slice at a time gives what `json.loads` with `sample_hook`
gives, and fails where it fails."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpuwarden import promjson
from gpuwarden.promtypes import sample_hook

ITEM = '{"metric":{"namespace":"ml","pod":"p-%d"},"value":[1700000000.5,"%d"]}'


def vector(n: int, sep: str = ",", tail: str = "") -> str:
    return promjson.VECTOR_HEAD + sep.join(ITEM % (i, i) for i in range(n)) + "]}" + tail + "}"


@pytest.mark.parametrize(
    "text",
    [
        vector(0),
        vector(1),
        vector(7),  # more than one slice at slice_items=3, not a whole number of them
        vector(6),  # a whole number of slices
        vector(5, sep=" ,\n "),  # whitespace between items
        vector(4, tail=',"warnings":["w1"],"infos":["i"]'),
        promjson.VECTOR_HEAD + " ]}}",
        promjson.VECTOR_HEAD + '{"metric":{},"value":[1,"NaN"]},{"odd":1}]}}',  # an item sample_hook leaves
        '{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}',  # not a vector: whole
        '{"data":{"result":[],"resultType":"vector"},"status":"success"}',  # other field order: whole
        '{"status":"error","errorType":"bad_data","error":"parse error"}',
        # issue 44 (P1): a repeated key after the items replaces them in json.loads
        promjson.VECTOR_HEAD + ITEM % (1, 1) + '],"result":[]}}',
        promjson.VECTOR_HEAD + ITEM % (1, 1) + ']},"data":{"resultType":"vector","result":[]}}',
        promjson.VECTOR_HEAD + ITEM % (1, 1) + ']},"status":"error"}',
        promjson.VECTOR_HEAD + '{"metric":{},"value":[1%s,"1"]}]}}' % ("0" * 400),  # timestamp overflow
    ],
)
def test_decodes_as_json_loads_does(text: str) -> None:
    expected = json.loads(text, object_hook=sample_hook)
    got = asyncio.run(promjson.loads(text.encode(), large=0, slice_items=3))
    assert got == expected


def test_surrogate_bytes_decode_as_json_loads_decodes_them() -> None:
    """json.loads reads bytes with `surrogatepass` (issue 44, P1: the sliced path refused them)."""
    content = (
        (promjson.VECTOR_HEAD + '{"metric":{"a":"').encode() + b"\xed\xa0\x80" + b'"},"value":[1,"2"]}]}}'
    )
    expected = json.loads(content, object_hook=sample_hook)
    assert asyncio.run(promjson.loads(content, large=0)) == expected


@pytest.mark.parametrize("large", [0, promjson.LARGE_BYTES])
def test_nesting_too_deep_is_a_value_error(large: int) -> None:
    """json.loads raises RecursionError, which no caller maps; this raises a ValueError (TooDeep)."""
    content = (promjson.VECTOR_HEAD + "[" * 100_000 + "]" * 100_000 + "]}}").encode()
    with pytest.raises(RecursionError):
        json.loads(content, object_hook=sample_hook)
    with pytest.raises(promjson.TooDeep):
        asyncio.run(promjson.loads(content, large=large))


@pytest.mark.parametrize(
    "text",
    [
        vector(3)[:-10],  # truncated inside an item
        promjson.VECTOR_HEAD + ITEM % (1, 1) + " " + ITEM % (2, 2) + "]}}",  # no comma
        promjson.VECTOR_HEAD + ITEM % (1, 1) + ",]}}",  # trailing comma
        promjson.VECTOR_HEAD + ITEM % (1, 1) + "]}",  # the top-level object not closed
        vector(2) + "x",  # trailing garbage
    ],
)
def test_malformed_json_raises_value_error_as_json_loads_does(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text, object_hook=sample_hook)
    with pytest.raises(ValueError):
        asyncio.run(promjson.loads(text.encode(), large=0, slice_items=3))


def test_invalid_utf8_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        asyncio.run(promjson.loads(promjson.VECTOR_HEAD.encode() + b'"\xff"]}}', large=0))


@pytest.mark.parametrize(
    ("size", "head", "expected"),
    [
        (promjson.LARGE_BYTES, promjson.VECTOR_HEAD, True),
        (promjson.LARGE_BYTES - 1, promjson.VECTOR_HEAD, False),  # small: decoded whole
        (promjson.LARGE_BYTES, '{"status":"success","data":{"resultType":"matrix","result":[', False),
        (promjson.LARGE_BYTES, '{"status":"error"', False),
    ],
)
def test_sliceable(size: int, head: str, expected: bool) -> None:
    content = (head + "x" * size).encode()[:size]
    assert promjson.sliceable(content) is expected


def test_a_large_vector_yields_to_the_loop_between_slices() -> None:
    async def run() -> tuple[int, Any]:
        ticks = 0

        async def count() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        counter = asyncio.ensure_future(count())
        await asyncio.sleep(0)
        started = ticks
        body = await promjson.loads(vector(10).encode(), large=0, slice_items=2)
        counter.cancel()
        return ticks - started, body

    ran, body = asyncio.run(run())
    assert len(body["data"]["result"]) == 10
    assert ran >= 4  # the other task ran between the slices
