"""`gpuwarden check-config` judges rule templates with the adapter's own engine, as the adapter will at start.

The config models only check delimiters and field names; `adapter.gotemplate` also rejects actions it does
not implement (`if`, `range`, pipelines, other functions). Every such template is reported with its field
path and line, together with the models' problems, once per field. Each accepted template here is also
compiled by `Adapter` (what `gpuwarden adapter` does at start), so check-config and start-up cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adapter.app import Adapter, validate_config
from gpuwarden import cli
from gpuwarden.config import load_config
from gpuwarden.errors import ConfigError

GOOD_QUERY = "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"


def config_file(tmp_path: Path, rules: list[dict[str, object]], external: bool = False) -> Path:
    path = tmp_path / "config.yaml"
    key = "externalRules" if external else "rules"
    path.write_text(yaml.safe_dump({"adapter": {key: rules}}, sort_keys=False))
    return path


def rule(metrics_query: str, template: str | None = None) -> dict[str, object]:
    out: dict[str, object] = {"seriesQuery": 'x{pod!=""}', "metricsQuery": metrics_query}
    if template is not None:
        out["resources"] = {"template": template}
    return out


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = cli.main(["check-config", str(path)])
    captured = capsys.readouterr()
    text = captured.err if code else captured.out
    return code, [line.removeprefix(f"{path}: ") for line in text.splitlines()]


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(GOOD_QUERY, id="fields"),
        pytest.param('<<index .LabelValuesByName "pod">>', id="index"),
        pytest.param("<<len .GroupBySlice>>", id="len"),
        pytest.param("<<.Series>><</* a comment */>>", id="comment"),
        pytest.param("sum(<<- .Series ->>)", id="trim-markers"),
        pytest.param("<<.LabelValuesByName.pod>>", id="nested-field"),
        pytest.param("up", id="no-actions"),
    ],
)
def test_templates_the_adapter_runs_pass(
    query: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, [rule(query, "<<.Resource>>")])
    code, lines = check(path, capsys)
    assert (code, len(lines)) == (0, 1), lines
    assert lines[0].startswith("OK (adapter: 1 rules")
    Adapter(load_config(path, {}))  # what the adapter compiles at start accepts it too


@pytest.mark.parametrize(
    ("query", "message"),
    [
        pytest.param("<<if .Series>>x<<end>>", "unsupported action <<if .Series>> (supported:", id="if"),
        pytest.param("<<range .GroupBySlice>><<.>><<end>>", "unsupported action <<range", id="range"),
        pytest.param("<<.GroupBy | lower>>", "unsupported action <<.GroupBy | lower>>", id="pipeline"),
        pytest.param('<<printf "%s" .Series>>', "unsupported action <<printf", id="other-function"),
        pytest.param("<<index .LabelValuesByName>>", "wrong number of arguments", id="index-arity"),
        pytest.param("<<len .Series .GroupBy>>", "wrong number of arguments", id="len-arity"),
        pytest.param("<<index .LabelValuesByName pod>>", "unsupported argument 'pod'", id="bare-word"),
        pytest.param("<< >>", "empty action", id="empty"),
        pytest.param("<<$x := .Series>>", "unsupported action", id="variable"),
    ],
)
def test_templates_the_adapter_rejects_are_reported_with_their_field(
    query: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, [rule(GOOD_QUERY), rule(query)])
    code, lines = check(path, capsys)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"adapter.rules[1].metricsQuery: {message}"), lines
    assert lines[0].endswith("(line 6)")
    with pytest.raises(ConfigError):  # and the adapter would indeed refuse to start
        Adapter(load_config(path, {}))


def test_label_template_with_other_actions_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, [rule(GOOD_QUERY, "kube_<<.Resource>>_<<len .Group>>")], external=True)
    code, lines = check(path, capsys)
    assert code == 1
    assert lines == [
        "adapter.externalRules[0].resources.template: a label template may only use <<.Group>> and "
        "<<.Resource>> (line 6)"
    ]


def test_every_problem_at_once_and_each_field_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "prometheus:\n"
        "  timeout_seconds: fast\n"
        "adapter:\n"
        "  rules:\n"
        "  - seriesQuery: a\n"
        "    metricsQuery: <<.Nope>>\n"  # the models' check names it; the adapter's would repeat it
        "    seriesFilters: [{is: a, isNot: b}]\n"
        "  - seriesQuery: b\n"
        "    metricsQuery: <<if .Series>>1<<end>>\n"
        "  externalRules:\n"
        "  - seriesQuery: c\n"
        "    metricsQuery: <<.Series | x>>\n"
        "    resources: {namespaced: maybe}\n"  # the rule is invalid, its template is still judged
    )
    code, lines = check(path, capsys)
    assert code == 1
    fields = [line.split(": ")[0] for line in lines]
    assert sorted(fields) == [
        "adapter.externalRules[0].metricsQuery",
        "adapter.externalRules[0].resources.namespaced",
        "adapter.rules[0].metricsQuery",
        "adapter.rules[0].seriesFilters[0]",
        "adapter.rules[1].metricsQuery",
        "prometheus.timeout_seconds",
    ]
    nope = "adapter.rules[0].metricsQuery: unknown template field .Nope"
    assert any(line.startswith(nope) for line in lines)


def test_rules_file_templates_are_checked_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "adapter-rules.yaml").write_text(yaml.safe_dump({"rules": [rule("<<if .Series>><<end>>")]}))
    path = tmp_path / "config.yaml"
    path.write_text(f"adapter:\n  rules_file: adapter-rules.yaml\n  rules:\n  - {rule(GOOD_QUERY)}\n")
    code, lines = check(path, capsys)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith("adapter.rules[1].metricsQuery: unsupported action <<if")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({}, [], id="no-adapter"),
        pytest.param({"adapter": "x"}, [], id="adapter-not-a-mapping"),
        pytest.param({"adapter": {"rules": "x"}}, [], id="rules-not-a-list"),
        pytest.param({"adapter": {"rules": ["x", {"metricsQuery": 3}]}}, [], id="left-to-the-models"),
        pytest.param(
            {"adapter": {"external_rules": [{"metrics_query": "<<len>>"}]}},
            [(("adapter", "external_rules", 0, "metrics_query"), "wrong number of arguments in <<len>>")],
            id="snake-case-keys",
        ),
    ],
)
def test_validate_config_on_raw_data(data: dict[str, object], expected: list[object]) -> None:
    assert validate_config(data) == expected
