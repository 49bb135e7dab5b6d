"""HTTP/1.1's one room: message heads and framing (`head`), the keep-alive API client (`client`, `pool`)
and the lean server core (`server`) that the extender's verbs and the node agent's probes are served on.

Why a room: HTTP/1.1 was written three times (two head parsers beside the API client's, two body readers,
two response writers), and every copy read framing a little differently. Here it is written once, strict
per RFC 9112, parsed by llhttp (`httptools`), and held to h11 by differential fuzz tests. Only this package
imports `httptools` (`.importlinter`); it imports nothing of gpuwarden's, so every deployable can use it
without pulling in the rest.
"""
