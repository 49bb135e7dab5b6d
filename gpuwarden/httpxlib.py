"""httpx, imported without its command-line client: the one place gpuwarden imports httpx from.

Why: `import httpx` also tries `httpx._main` (the `httpx` command), which pulls in click, rich and pygments
when they are installed — ~4 MiB of RSS in every process that reads Prometheus. The image ships none of
them (they are not product dependencies), so there the import fails quietly and costs nothing; a development
venv has all three (import-linter needs them) and the same process would measure 4 MiB heavier there than in
the image. Marking `httpx._main` as absent before the first `import httpx` makes both behave like the image.
gpuwarden never runs httpx's command line; `httpx.main()` then prints httpx's own "dependencies not installed"
message, as it does in the image.

What it must not do: change anything else of httpx (transports, defaults); importing httpx directly elsewhere
would skip the marker for whoever imports first.
"""

from __future__ import annotations

import sys

if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable"

import httpx as httpx

__all__ = ["httpx"]
