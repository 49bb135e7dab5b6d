"""gzip bodies assembled from independently compressed, cached chunks (the pigz technique).

Why it exists: Prometheus always sends `Accept-Encoding: gzip`, and compressing a 200 MB whole-fleet body
from scratch costs about a second of CPU per scrape. Each exposition chunk is compressed once, as raw
deflate ending on a byte boundary (`Z_SYNC_FLUSH`), and cached on the chunk; a body is the gzip header,
the chunks' deflate data in order, a final empty block, and the CRC-32/size trailer. The result is one
ordinary single-member gzip stream that any client decodes. Unchanged chunks are never recompressed.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from harness.simulator.exposition import Chunk

GZIP_HEADER = (
    b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # magic, deflate, no flags, mtime 0, xfl 0, OS unknown
)
FINAL_EMPTY_BLOCK = b"\x03\x00"  # BFINAL=1, fixed Huffman, end-of-block
LEVEL = 1  # the body is label-heavy and compresses ~7x even at level 1; higher levels cost 3-5x the CPU


def deflate(data: bytes) -> bytes:
    """Raw deflate of `data`, flushed to a byte boundary so streams can be concatenated."""
    co = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    return co.compress(data) + co.flush(zlib.Z_SYNC_FLUSH)


def gzip_chunks(chunks: Sequence[Chunk]) -> bytes:
    """A gzip stream of the chunks' concatenated data, compressing only chunks not compressed before."""
    parts = [GZIP_HEADER]
    crc = 0
    size = 0
    for chunk in chunks:
        if chunk.gz is None:
            chunk.gz = deflate(chunk.data)
        parts.append(chunk.gz)
        crc = zlib.crc32(chunk.data, crc)
        size += len(chunk.data)
    parts.append(FINAL_EMPTY_BLOCK)
    parts.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
    return b"".join(parts)
