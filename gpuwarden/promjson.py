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
malformed JSON raises `ValueError` as `json.loads` does.
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


def _skip_space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return match.end() if match is not None else pos


def sliceable(content: bytes, large: int = LARGE_BYTES) -> bool:
    """Whether an answer is decoded a slice at a time: large and an instant vector."""
    return len(content) >= large and content.startswith(_VECTOR_HEAD_BYTES)


async def loads(content: bytes, *, large: int = LARGE_BYTES, slice_items: int = SLICE_ITEMS) -> Any:
    """`json.loads(content, object_hook=sample_hook)`, yielding to the event loop between slices of a large
    vector's items."""
    if not sliceable(content, large):
        return json.loads(content, object_hook=sample_hook)
    text = content.decode()  # UnicodeDecodeError is a ValueError, as from json.loads
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
    body = json.loads(VECTOR_HEAD + "]" + text[pos:], object_hook=sample_hook)
    body["data"]["result"] = items
    return body
