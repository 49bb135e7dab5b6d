"""Structured logs: JSON carries `extra` fields; text is one readable line."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gpuwarden import logs


@pytest.fixture(autouse=True)
def _restore_root() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_extra_fields() -> None:
    buf = io.StringIO()
    logs.setup("info", "json", stream=buf)
    logging.getLogger("gpuwarden.test").info("node quarantined", extra={"node": "gpu-1", "xid": 79})
    doc = json.loads(buf.getvalue().strip())
    assert doc["msg"] == "node quarantined"
    assert doc["level"] == "info"
    assert doc["node"] == "gpu-1"
    assert doc["xid"] == 79
    assert doc["ts"].endswith("Z")


def test_auto_uses_json_when_not_a_tty_and_debug_is_filtered() -> None:
    buf = io.StringIO()
    logs.setup("info", "auto", stream=buf)
    log = logging.getLogger("gpuwarden.test")
    log.debug("hidden")
    log.warning("shown")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["msg"] == "shown"


def test_text_format_has_key_values() -> None:
    buf = io.StringIO()
    logs.setup("info", "text", stream=buf)
    logging.getLogger("gpuwarden.test").info("released", extra={"node": "gpu-2"})
    line = buf.getvalue().strip()
    assert "released" in line
    assert "node=gpu-2" in line
