"""Structured logging: JSON lines for machines, readable text on a TTY.

Why: operators ship controller logs to Loki/Elasticsearch and grep them by key (node=, reason=); a human at a
terminal wants one readable line. Call `log.info("node quarantined", extra={"node": n})` and every `extra`
key becomes a field. Named `logs` so it does not shadow the stdlib `logging`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal, TextIO

_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

LogFormat = Literal["json", "text", "auto"]


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then every `extra` field."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`HH:MM:SS level logger: msg key=value ...` for terminals."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "info", fmt: LogFormat = "auto", stream: TextIO | None = None) -> None:
    """Configure the root logger once, at process start (CLI only; library code never calls this)."""
    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "httpx", "httpcore", "kubernetes", "urllib3", "apscheduler"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
