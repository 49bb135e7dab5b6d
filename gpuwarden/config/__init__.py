"""gpuwarden's configuration: typed, documented models for the one YAML file, and the loader.

Why a package: config sits at the bottom of the layer stack — every client, loop and server imports it and
it imports none of them. Use `load_config(path, env, overrides)` at start-up and pass the resulting frozen
`Config` (or one of its sections) down; nothing else reads files or the environment for settings.

The names below are imported on first use, so importing a pydantic-free module of this package (the node
agent's `lean` loader, `overrides`, `yamlsource`) does not import pydantic and every model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwarden.config.loader import check_config, load_config
    from gpuwarden.config.report import format_problems
    from gpuwarden.config.root import SECTIONS, Config

__all__ = ["SECTIONS", "Config", "check_config", "format_problems", "load_config"]

_HOME = {
    "SECTIONS": "gpuwarden.config.sections",
    "Config": "gpuwarden.config.root",
    "check_config": "gpuwarden.config.loader",
    "load_config": "gpuwarden.config.loader",
    "format_problems": "gpuwarden.config.report",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
