"""The loader: precedence file < env < CLI, env parsing, YAML syntax and duplicate keys, all errors at once,
where each value came from, and prometheus-adapter's rules file."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.config import Config, load_config
from gpuwarden.config.loader import env_overrides, parse_env_value
from gpuwarden.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems(
    path: Path | None, env: dict[str, str] | None = None, cli: dict[str, Any] | None = None
) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env or {}, cli)
    return caught.value.problems


@pytest.mark.parametrize(
    ("file_value", "env_value", "cli_value", "expected"),
    [
        pytest.param(None, None, None, 10.0, id="default"),
        pytest.param(20, None, None, 20.0, id="file"),
        pytest.param(20, "30", None, 30.0, id="env-over-file"),
        pytest.param(20, "30", 40, 40.0, id="cli-over-env"),
        pytest.param(None, None, 40, 40.0, id="cli-over-default"),
        pytest.param(20, None, None, 20.0, id="cli-none-is-not-given"),
    ],
)
def test_precedence_file_env_cli(
    tmp_path: Path, file_value: int | None, env_value: str | None, cli_value: int | None, expected: float
) -> None:
    text = "health:\n  breaker:\n" + (f"    max_percent: {file_value}\n" if file_value is not None else "")
    env = {"GPUWARDEN_HEALTH__BREAKER__MAX_PERCENT": env_value} if env_value is not None else {}
    config = load_config(write(tmp_path, text), env, {"health.breaker.max_percent": cli_value})
    assert config.health.breaker.max_percent == expected


ENV_CASES = [
    pytest.param({"GPUWARDEN_HEALTH__DRY_RUN": "true"}, lambda c: c.health.dry_run is True, id="bool"),
    pytest.param({"GPUWARDEN_HEALTH__DRY_RUN": "yes"}, lambda c: c.health.dry_run is True, id="bool-yes"),
    pytest.param(
        {"GPUWARDEN_ADAPTER__SECURE_PORT": "8443"}, lambda c: c.adapter.secure_port == 8443, id="int"
    ),
    pytest.param(
        {"gpuwarden_logging__level": "DEBUG"}, lambda c: c.logging.level == "debug", id="case-insensitive"
    ),
    pytest.param(
        {"GPUWARDEN_PROMETHEUS__URL": "http://thanos:9090"},
        lambda c: str(c.prometheus.url) == "http://thanos:9090/",
        id="url",
    ),
    pytest.param(
        {"GPUWARDEN_HEALTH__NODE_LABELS": '["node"]'},
        lambda c: c.health.node_labels == ["node"],
        id="json-list",
    ),
    pytest.param(
        {"GPUWARDEN_PROMETHEUS__HEADERS": '{"X-Scope-OrgID": "1234"}'},
        lambda c: c.prometheus.headers == {"X-Scope-OrgID": "1234"},
        id="json-mapping-keeps-case-and-string-values",
    ),
    pytest.param(
        {"GPUWARDEN_HEALTH__XID__OVERRIDES__79__QUARANTINE": "false"},
        lambda c: c.health.xid.overrides[79].quarantine is False,
        id="nested-int-key",
    ),
    pytest.param(
        {"GPUWARDEN_PREEMPTION__GLOBAL_BUDGET": "null"},
        lambda c: c.preemption.global_budget is None,
        id="null",
    ),
    pytest.param(
        {"GPUWARDEN_HEALTH__LABEL_MATCHERS": 'cluster="a"'},
        lambda c: c.health.label_matchers == 'cluster="a"',
        id="string-with-quotes-inside",
    ),
    pytest.param(
        {"GPUWARDEN_KUBERNETES__NAMESPACE": '"null"'},
        lambda c: c.kubernetes.namespace == "null",
        id="quoted-string",
    ),
    pytest.param(
        {"GPUWARDEN_CONFIG": "/etc/x.yaml", "HOME": "/root"},
        lambda c: c == Config(),
        id="non-overrides-ignored",
    ),
]


@pytest.mark.parametrize(("env", "check"), ENV_CASES)
def test_env_overrides(env: dict[str, str], check: Any) -> None:
    assert check(load_config(None, env))


def test_env_merges_into_file_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  xid:\n    overrides:\n      79: {class: hw_pcie}\n")
    config = load_config(path, {"GPUWARDEN_HEALTH__XID__OVERRIDES__79__QUARANTINE": "true"})
    override = config.health.xid.overrides[79]
    assert (override.class_, override.quarantine) == ("hw_pcie", True)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("20", "20"),
        ("null", None),
        ("~", None),
        ("[1, 2]", [1, 2]),
        ("{a: 1}", {"a": 1}),
        ('"x"', "x"),
        ("", ""),
    ],
)
def test_parse_env_value(raw: str, expected: object) -> None:
    assert parse_env_value(raw) == expected


@pytest.mark.parametrize(
    ("env", "field", "fragment"),
    [
        ({"GPUWARDEN_LOGGING_LEVEL": "debug"}, "env GPUWARDEN_LOGGING_LEVEL", "GPUWARDEN_LOGGING__LEVEL"),
        ({"GPUWARDEN_HEALTH____DRY_RUN": "1"}, "env GPUWARDEN_HEALTH____DRY_RUN", "empty path segment"),
        ({"GPUWARDEN_HEALTH__NODE_LABELS": "[a, "}, "health.node_labels", "cannot parse the value"),
        (
            {"GPUWARDEN_HEALTH__BREAKER__MAX_PERCENT": "lots"},
            "health.breaker.max_percent",
            "from GPUWARDEN_HEALTH",
        ),
        (
            {"GPUWARDEN_HELTH__DRY_RUN": "true"},
            "helth",
            "did you mean 'health'? (from GPUWARDEN_HELTH__DRY_RUN)",
        ),
    ],
)
def test_env_problems_name_the_variable(env: dict[str, str], field: str, fragment: str) -> None:
    found = problems(None, env)
    assert [f for f, _ in found] == [field]
    assert fragment in found[0][1]


def test_env_overrides_sorted_and_only_with_double_underscore() -> None:
    found, issues = env_overrides({"GPUWARDEN_B__X": "1", "GPUWARDEN_A__Y": "2", "GPUWARDEN_DEMO": "x"})
    assert [(p, v) for p, v, _ in found] == [(("a", "y"), "2"), (("b", "x"), "1")]
    assert issues == []


def test_cli_problem_names_command_line(tmp_path: Path) -> None:
    found = problems(None, {}, {"adapter.secure_port": 99999, "bad..path": 1})
    assert found == [
        ("(command line)", "'bad..path' is not a dotted field path such as prometheus.url"),
        ("adapter.secure_port", "must be <= 65535, got 99999 (from the command line)"),
    ]


def test_override_replacing_file_value_reports_override_origin(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  breaker: {max_percent: 5}\n")
    found = problems(path, {"GPUWARDEN_HEALTH__BREAKER": '{"max_percent": 500}'})
    assert found == [
        ("health.breaker.max_percent", "must be <= 100, got 500 (from GPUWARDEN_HEALTH__BREAKER)")
    ]


def test_override_into_non_mapping_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  breaker: 3\n")
    found = problems(path, {"GPUWARDEN_HEALTH__BREAKER__MAX_PERCENT": "5"})
    origin = "from GPUWARDEN_HEALTH__BREAKER__MAX_PERCENT"
    assert found[0] == (
        "health.breaker",
        f"cannot apply override ({origin}): the value here is not a mapping",
    )


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        pytest.param(
            "health:\n  dry_run: true\n bad: 1\n", "line 3, column 2", "YAML syntax error", id="indent"
        ),
        pytest.param(
            "health: {dry_run: true\n", "line 2, column 1", "expected ',' or '}'", id="unclosed-flow"
        ),
        pytest.param(
            "logging:\n  level: 'info\n", "line 3, column 1", "found unexpected end", id="unclosed-quote"
        ),
        pytest.param("a: b: c\n", "line 1, column 5", "mapping values are not allowed here", id="colon"),
        pytest.param("- health\n", "(root)", "must be a mapping of sections", id="list-root"),
    ],
)
def test_yaml_syntax_error_names_line_and_column(
    tmp_path: Path, text: str, field: str, fragment: str
) -> None:
    found = problems(write(tmp_path, text))
    assert len(found) == 1
    assert found[0][0] == field
    assert fragment in found[0][1]


def test_duplicate_keys_are_reported_with_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  dry_run: true\n  loop_interval_seconds: 5\n  dry_run: false\n")
    assert problems(path) == [
        (
            "health.dry_run",
            "key given twice, on lines 2 and 4; YAML would silently keep only the last value, so remove one",
        )
    ]


def test_unreadable_file(tmp_path: Path) -> None:
    found = problems(tmp_path / "missing.yaml")
    assert found[0][0] == "(file)" and "No such file or directory" in found[0][1]


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        prometheus: {timeout_seconds: soon}
        adapter: {secure_port: 0, rules: [{seriesQuery: x}]}
        health:
          dry_run: true
          dry_run: false
          breaker: {max_percent: 200, bogus: 1}
        logging: {format: xml}
        """,
    )
    found = problems(
        path, {"GPUWARDEN_EXTENDER__PORT": "-1", "GPUWARDEN_LOGGING_LEVEL": "x"}, {"kubernetes.qps": 0}
    )
    fields = [f for f, _ in found]
    assert fields == [
        "health.dry_run",
        "env GPUWARDEN_LOGGING_LEVEL",
        "prometheus.timeout_seconds",
        "kubernetes.qps",
        "adapter.rules[0].metricsQuery",
        "adapter.secure_port",
        "health.breaker.max_percent",
        "health.breaker.bogus",
        "extender.port",
        "logging.format",
    ]
    where = dict(found)
    assert where["prometheus.timeout_seconds"].endswith("(line 1)")
    assert where["health.breaker.max_percent"].endswith("(line 6)")
    assert where["extender.port"].endswith("(from GPUWARDEN_EXTENDER__PORT)")
    assert where["kubernetes.qps"].endswith("(from the command line)")


def test_rules_file_is_loaded_unchanged_and_appended(tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    write(tmp_path, (REPO / "examples/config/prometheus-adapter.yaml").read_text(), "adapter/pa.yaml")
    inline = (
        "{seriesQuery: inline_total, metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'}"
    )
    path = write(tmp_path, f"adapter:\n  rules_file: adapter/pa.yaml\n  rules: [{inline}]\n")
    config = load_config(path, {})
    assert [r.series_query for r in config.adapter.rules] == [
        "inline_total",
        '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}',
        'inference_queue_depth{namespace!="",pod!=""}',
    ]
    assert len(config.adapter.external_rules) == 1


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param(
            "rules:\n- seriesQuery: x\n  metricsQuery: '<<.Nope>>'\n",
            "rules[0].metricsQuery: unknown",
            id="bad",
        ),
        pytest.param("rules: [\n", "line 2, column 1: YAML syntax error", id="syntax"),
        pytest.param("rulez: []\n", "rulez: unknown key; did you mean 'rules'? (line 1)", id="unknown-key"),
    ],
)
def test_rules_file_problems_are_reported_at_rules_file(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    if content is not None:
        write(tmp_path, content, "pa.yaml")
    path = write(tmp_path, "adapter: {rules_file: pa.yaml, secure_port: 0}\n")
    found = problems(path)
    assert [f for f, _ in found] == ["adapter.rules_file", "adapter.secure_port"]
    assert str(tmp_path / "pa.yaml") in found[0][1] and fragment in found[0][1]
