"""Decoding a large Prometheus answer without holding the event loop: the vector items a slice at a time.

Why: the adapter's cache refresh asks for a metric of every pod at once; at 10,000 pods the answer is
0.9 MiB and `json.loads` with `sample_hook` takes 25-40 ms of pure Python in one call. Measured in the
same-run bench (tests/bench/bench_adapter_upstream.py) with a loop-lag probe: two such stalls of 30-50 ms
every 15 s, and every request in flight waited them out. Decoded item by item with `raw_decode`, yielding
to the loop every `SLICE_ITEMS` items (about 1 ms of work), the same answer costs the same CPU and no
request waits more than a slice.

What it must not do: decode anything differently from `json.loads(content, object_hook=sample_hook)` - an
answer not shaped as Prometheus writes an instant vector (`{"status":"success","data":{"resultType":
"vector","result":[` first, as Prometheus' encoder orders the fields), or a small one, is decoded whole;
malformed JSON raises `ValueError` as `json.loads` does. Held to that by a differential fuzz test
(tests/unit/test_fuzz_promjson.py); where they could part, the sliced path steps aside: the bytes are read
as `json.loads` reads them (UTF-8 with surrogates passed through), and a tail that repeats a key (a second
`result` or `data` after the items, which would replace them) is decoded whole. Where `json.loads` raises
something that is not a `ValueError` (a `RecursionError` on deep nesting), this raises `TooDeep`, a
`ValueError`, so the caller's error mapping sees a refusal like any other malformed answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from gpuwarden.promtypes import sample_hook

VECTOR_HEAD = '{"status":"success","data":{"resultType":"vector","result":['
SLICE_ITEMS = 400
"""Vector items decoded between two yields to the event loop (~1 ms at 2-3 µs an item)."""
LARGE_BYTES = 256 * 1024
"""Answers smaller than this are decoded whole (under ~10 ms: not worth the yields)."""

_VECTOR_HEAD_BYTES = VECTOR_HEAD.encode()
_SPACE = re.compile(r"[ \t\n\r]*")
_SPACES = frozenset(" \t\n\r")
_DECODER = json.JSONDecoder(object_hook=sample_hook)


class TooDeep(ValueError):
    """The JSON nests deeper than the decoder's recursion allows (`json.loads` raises `RecursionError`)."""


class _RepeatedKey(Exception):
    """A repeated key in the tail after the vector's items: decode the whole answer instead."""


def _unique_then_hook(pairs: list[tuple[str, Any]]) -> Any:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _RepeatedKey
    return sample_hook(obj)


_TAIL_DECODER = json.JSONDecoder(object_pairs_hook=_unique_then_hook)


def _skip_space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return match.end() if match is not None else pos


def sliceable(content: bytes, large: int = LARGE_BYTES) -> bool:
    """Whether an answer is decoded a slice at a time: large and an instant vector."""
    return len(content) >= large and content.startswith(_VECTOR_HEAD_BYTES)


async def loads(content: bytes, *, large: int = LARGE_BYTES, slice_items: int = SLICE_ITEMS) -> Any:
    """`json.loads(content, object_hook=sample_hook)`, yielding to the event loop between slices of a large
    vector's items; `TooDeep` where it would raise `RecursionError`."""
    try:
        if not sliceable(content, large):
            return json.loads(content, object_hook=sample_hook)
        return await _sliced(content, slice_items)
    except RecursionError:
        raise TooDeep("JSON nested too deeply") from None


async def _sliced(content: bytes, slice_items: int) -> Any:
    # as json.loads reads bytes (the head is ASCII, so UTF-8): surrogates pass, other bad bytes are a
    # UnicodeDecodeError, a ValueError
    text = content.decode("utf-8", "surrogatepass")
    items: list[Any] = []
    append, decode = items.append, _DECODER.raw_decode
    pos = _skip_space(text, len(VECTOR_HEAD))
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            item, pos = decode(text, pos)
            append(item)
            sep = text[pos : pos + 1]
            if sep in _SPACES:  # Prometheus writes none; other encoders might
                pos = _skip_space(text, pos)
                sep = text[pos : pos + 1]
            pos += 1
            if sep == "]":
                break
            if sep != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos - 1)
            if text[pos : pos + 1] in _SPACES:
                pos = _skip_space(text, pos)
            if len(items) % slice_items == 0:
                await asyncio.sleep(0)
    tail = VECTOR_HEAD + "]" + text[pos:]
    try:
        body, end = _TAIL_DECODER.raw_decode(tail)
    except _RepeatedKey:  # a later key may replace the items (json.loads keeps the last): decode it whole
        return json.loads(content, object_hook=sample_hook)
    if tail[end:].strip(" \t\n\r"):
        raise json.JSONDecodeError("Extra data", tail, end)
    body["data"]["result"] = items
    return body
