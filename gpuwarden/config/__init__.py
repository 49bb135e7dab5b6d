"""gpuwarden's configuration: typed, documented models for the one YAML file, and the loader.

Why a package: config sits at the bottom of the layer stack — every client, loop and server imports it and
it imports none of them. Use `load_config(path, env, overrides)` at start-up and pass the resulting frozen
`Config` (or one of its sections) down; nothing else reads files or the environment for settings.
"""

from gpuwarden.config.loader import check_config, load_config
from gpuwarden.config.report import format_problems
from gpuwarden.config.root import SECTIONS, Config

__all__ = ["SECTIONS", "Config", "check_config", "format_problems", "load_config"]
