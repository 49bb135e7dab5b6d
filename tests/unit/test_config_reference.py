"""The generated configuration reference: complete, documented field by field, and committed up to date."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from gpuwarden.config import SECTIONS, Config
from gpuwarden.config.modelpath import unwrap
from gpuwarden.config.reference import (
    REGENERATE,
    config_json_schema,
    config_reference_markdown,
    main,
    type_name,
)

REPO = Path(__file__).resolve().parents[2]


def all_models(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[type[BaseModel]]:
    from typing import get_args

    seen = set() if seen is None else seen
    seen.add(model)
    for info in model.model_fields.values():
        stack = [info.annotation]
        while stack:
            current = unwrap(stack.pop())
            if isinstance(current, type) and issubclass(current, BaseModel):
                if current not in seen:
                    all_models(current, seen)
            else:
                stack.extend(get_args(current))
    return seen


def test_docs_configuration_md_is_up_to_date() -> None:
    committed = (REPO / "docs/configuration.md").read_text(encoding="utf-8")
    assert committed == config_reference_markdown(), f"docs/configuration.md is stale; run `{REGENERATE}`"


@pytest.mark.parametrize(
    "model", sorted(all_models(Config), key=lambda m: m.__name__), ids=lambda m: m.__name__
)
def test_every_model_and_field_is_documented(model: type[BaseModel]) -> None:
    assert model.__doc__ and model.__doc__.strip(), f"{model.__name__} has no docstring"
    undocumented = [name for name, info in model.model_fields.items() if not (info.description or "").strip()]
    assert undocumented == []


def test_reference_has_a_table_per_section() -> None:
    text = config_reference_markdown()
    for section in SECTIONS:
        assert f"\n## `{section}`\n" in text
    assert "| `max_percent` | number (>= 0, <= 100) | `10` |" in text
    assert "| `seriesQuery` | string (length >= 1) | required |" in text


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (int, "integer"),
        (bool | None, "boolean or null"),
        (list[str], "list of string"),
        (dict[str, float], "map of string to number"),
    ],
)
def test_type_name(annotation: object, expected: str) -> None:
    assert type_name(annotation) == expected


def test_json_schema_uses_yaml_keys() -> None:
    schema = config_json_schema()
    assert set(schema["properties"]) == set(SECTIONS)
    assert "seriesQuery" in schema["$defs"]["DiscoveryRule"]["properties"]


def test_main_prints_markdown_and_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out == config_reference_markdown()
    assert main(["--json-schema"]) == 0
    assert '"$defs"' in capsys.readouterr().out
    assert main(["--bogus"]) == 2
