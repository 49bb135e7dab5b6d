"""Load the config: YAML file, then environment overrides, then command-line overrides, validated once.

Why one loader: precedence (file < env < CLI), error collection (every problem at once, each naming its
field and where its value came from) and prometheus-adapter's `rules_file` must behave the same for every
command. Nothing here knows what a field means; the models do.

Environment: `GPUWARDEN_<SECTION>__<KEY>[__<KEY>...]=value`, e.g. `GPUWARDEN_HEALTH__BREAKER__MAX_PERCENT=5`.
Path segments are case-insensitive. A value starting with `[` or `{` is parsed as YAML/JSON (lists and
mappings, e.g. `GPUWARDEN_ADAPTER__RULES='[...]'`); `null` or `~` is null; anything else is passed as a string
and converted by the field's type (`true`, `20`, `2.5` work). Variables without `__` (such as a future
`GPUWARDEN_CONFIG`) are not overrides and are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuwarden.config.metric_rules import PrometheusAdapterRules
from gpuwarden.config.modelpath import fill_empty_sections
from gpuwarden.config.overrides import (
    CLI_ORIGIN,
    ENV_PREFIX,
    apply_override,
    cli_overrides,
    env_overrides,
    parse_env_value,
)
from gpuwarden.config.report import Problem, format_problems, problems_from_validation
from gpuwarden.config.root import Config
from gpuwarden.config.yamlsource import Path as DataPath
from gpuwarden.config.yamlsource import dotted, parse_yaml
from gpuwarden.errors import ConfigError

__all__ = [
    "CLI_ORIGIN",
    "ENV_PREFIX",
    "apply_override",
    "check_config",
    "cli_overrides",
    "env_overrides",
    "load_config",
    "parse_env_value",
    "summary",
]

RawCheck = Callable[[Mapping[str, Any]], list[tuple[DataPath, str]]]
"""A further check on the merged raw config, e.g. the adapter's template compiler for `check-config`:
(data path, reason) per problem. Injected by the caller, so this kernel module imports no deployable."""


def _read(path: Path) -> tuple[str | None, Problem | None]:
    try:
        return path.read_text(encoding="utf-8"), None
    except OSError as exc:
        return None, ("(file)", f"cannot read {str(path)!r}: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        return None, ("(file)", f"not UTF-8 text: {exc.reason} at byte {exc.start}")


def _merge_rules_file(raw: dict[Any, Any], base_dir: Path) -> list[Problem]:
    """Append the rules of `adapter.rules_file` (a prometheus-adapter config) to the inline rules."""
    adapter = raw.get("adapter")
    location = adapter.get("rules_file") if isinstance(adapter, dict) else None
    if not isinstance(location, str | Path):
        return []  # absent, or a wrong type the model reports
    assert isinstance(adapter, dict)
    path = Path(location) if Path(location).is_absolute() else base_dir / location
    text, problem = _read(path)
    if text is None:
        assert problem is not None
        return [("adapter.rules_file", problem[1])]
    doc = parse_yaml(text)
    problems = [("adapter.rules_file", f"{path}: {field}: {msg}") for field, msg in doc.problems]
    data = {} if doc.data is None else doc.data
    if problems:
        return problems
    try:
        PrometheusAdapterRules.model_validate(data)
    except ValidationError as exc:
        origins = {p: f"line {line}" for p, line in doc.lines.items()}
        found = problems_from_validation(exc, origins, PrometheusAdapterRules)
        return [("adapter.rules_file", f"{path}: {field}: {msg}") for field, msg in found]
    for alias, name in (("rules", "rules"), ("externalRules", "external_rules")):
        extra = data.get(alias) or []
        if extra:
            key = name if name in adapter and alias not in adapter else alias
            adapter[key] = list(adapter.get(key) or []) + list(extra)
    if data.get("resourceRules") is not None:
        if adapter.get("resourceRules") is not None or adapter.get("resource_rules") is not None:
            return [("adapter.resourceRules", f"set both here and in rules_file {path}; keep one")]
        adapter["resourceRules"] = data["resourceRules"]
    return []


PROMETHEUS_ADAPTER_KEYS = frozenset({"rules", "externalRules", "resourceRules"})


def adopt_prometheus_adapter_file(
    raw: dict[Any, Any], origins: dict[DataPath, str]
) -> tuple[dict[Any, Any], dict[DataPath, str]]:
    """A prometheus-adapter `--config` file (only rules / externalRules / resourceRules at the top) read
    as the `adapter:` section, so the file kube-prometheus mounts works as `--config` unchanged."""
    if not raw or not set(raw) <= PROMETHEUS_ADAPTER_KEYS:
        return raw, origins
    return {"adapter": raw}, {("adapter", *p): where for p, where in origins.items()}


def load_config(
    path: Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    checks: Sequence[RawCheck] = (),
) -> Config:
    """Read, override and validate the configuration; raise `ConfigError` listing every problem at once.

    `path`: the YAML file, or None for defaults only. `env`: the environment (None: `os.environ`).
    `overrides`: dotted field paths → values from command-line flags (None values are ignored).
    `checks`: further checks of the merged data; a field the models already flagged is not reported twice.
    """
    environ = os.environ if env is None else env
    problems: list[Problem] = []
    raw: dict[Any, Any] = {}
    origins: dict[DataPath, str] = {}
    if path is not None:
        text, problem = _read(path)
        if problem is not None:
            raise ConfigError([problem])
        assert text is not None
        doc = parse_yaml(text)
        if doc.data is None and doc.problems:
            raise ConfigError(doc.problems)  # a syntax error: nothing further can be checked
        problems.extend(doc.problems)
        if doc.data is not None and not isinstance(doc.data, dict):
            raise ConfigError(
                [("(root)", "the file must be a mapping of sections (prometheus:, health:, ...)")]
            )
        raw, origins = adopt_prometheus_adapter_file(
            doc.data or {}, {p: f"line {line}" for p, line in doc.lines.items() if p}
        )
    from_env, env_problems = env_overrides(environ)
    from_cli, cli_problems = cli_overrides(overrides or {})
    problems.extend(env_problems + cli_problems)
    for data_path, value, origin in from_env + from_cli:
        failed = apply_override(raw, data_path, value, origin, origins)
        if failed is not None:
            problems.append(failed)
    fill_empty_sections(raw, Config)  # `health:` with every child commented out means the defaults
    base_dir = path.parent if path is not None else Path.cwd()
    problems.extend(_merge_rules_file(raw, base_dir))
    config: Config | None = None
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, origins))
    flagged = {field for field, _ in problems}
    for check in checks:
        for data_path, reason in check(raw):
            field, where = dotted(data_path), origins.get(data_path)
            if field not in flagged:
                problems.append((field, f"{reason} ({where})" if where else reason))
    if problems or config is None:
        raise ConfigError(problems)
    return config


def check_config(
    path: Path,
    env: Mapping[str, str],
    overrides: Mapping[str, object] | None = None,
    checks: Sequence[RawCheck] = (),
) -> tuple[int, str]:
    """`gpuwarden check-config FILE`: (0, 'FILE: OK ...') or (1, one line per problem)."""
    try:
        config = load_config(path, env, overrides, checks)
    except ConfigError as exc:
        return 1, format_problems(exc.problems, str(path))
    return 0, f"{path}: OK ({summary(config)})\n"


def summary(config: Config) -> str:
    """One line saying what this config turns on, so a wrong-but-valid file is noticed."""
    adapter = config.adapter
    presets = [
        p.name
        for p in (
            adapter.presets.gpu_utilization,
            adapter.presets.gpu_memory_used_ratio,
            adapter.presets.requests_per_second,
        )
        if p.enabled
    ]
    loops = []
    for name in ("health", "nominations", "idle", "preemption", "extender"):
        section = getattr(config, name)
        if section.enabled:
            loops.append(f"{name} (dry-run)" if getattr(section, "dry_run", False) else name)
    resource = ", resource metrics (metrics.k8s.io)" if adapter.resource_rules is not None else ""
    return (
        f"adapter: {len(adapter.rules)} rules, {len(adapter.external_rules)} external rules{resource}, "
        f"presets {', '.join(presets) or 'none'}; controller: {', '.join(loops) or 'nothing enabled'}"
    )
