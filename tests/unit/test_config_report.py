"""`gpuwarden check-config` output: the example configs; the bad one byte-for-byte against its golden file.

Regenerate the golden file after an intended wording change (from the repository root):

    .venv/bin/gpuwarden check-config examples/config/bad.yaml 2> tests/unit/golden/check-config/bad.txt
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden import cli
from gpuwarden.config import check_config, format_problems, load_config
from gpuwarden.config.loader import summary

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests/unit/golden/check-config/bad.txt"


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # file names in the output are as given on the command line


def test_bad_example_matches_golden_byte_for_byte(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["check-config", "examples/config/bad.yaml"])  # with the adapter's template checks
    assert code == 1
    text = capsys.readouterr().err
    assert text == GOLDEN.read_text(encoding="utf-8"), "check-config output changed; see the module docstring"


def test_bad_example_covers_each_kind_of_error() -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    for fragment in (
        "unknown key; did you mean",  # an unknown key
        "expected a number, got 'fast'",  # a wrong type
        "must be <= 65535, got 70000",  # an out-of-range number
        "must be one of 'json', 'text' or 'auto', got 'yaml'",  # a bad enum
        "adapter.rules[0].seriesFilters[0]: cannot have both",  # an invalid nested field
        "adapter.rules[1].metricsQuery: unsupported action <<.GroupBy | lower>>",  # the adapter's templates
    ):
        assert fragment in text
    assert all(line.startswith("examples/config/bad.yaml: ") for line in text.splitlines())


@pytest.mark.parametrize("name", ["good.yaml", "minimal.yaml"])
def test_good_examples_pass(name: str) -> None:
    code, text = check_config(Path("examples/config") / name, {})
    assert (code, text.splitlines()[0].split(" (")[0]) == (0, f"examples/config/{name}: OK")


def test_good_example_uses_every_section() -> None:
    config = load_config(Path("examples/config/good.yaml"), {})
    assert summary(config) == (
        "adapter: 3 rules, 2 external rules, resource metrics (metrics.k8s.io), presets gpu_utilization, "
        "gpu_memory_used_ratio, "
        "requests_per_second; controller: health, nominations, idle (dry-run), preemption, extender"
    )
    assert config.adapter.presets.dcgm_pod_label == "exported_pod"
    assert config.health.xid.overrides[109].quarantine is False


def test_check_config_applies_environment() -> None:
    code, text = check_config(Path("examples/config/minimal.yaml"), {"GPUWARDEN_HEALTH__DRY_RUN": "true"})
    assert code == 0 and "health (dry-run)" in text
    code, text = check_config(Path("examples/config/minimal.yaml"), {"GPUWARDEN_HEALTH__DRY_RUN": "often"})
    assert (code, text) == (
        1,
        "examples/config/minimal.yaml: health.dry_run: expected true or false, got 'often' "
        "(from GPUWARDEN_HEALTH__DRY_RUN)\n",
    )


def test_check_config_missing_file() -> None:
    code, text = check_config(Path("examples/config/nope.yaml"), {})
    assert code == 1
    assert text.startswith("examples/config/nope.yaml: (file): cannot read 'examples/config/nope.yaml'")


@pytest.mark.parametrize(
    ("problems", "file", "expected"),
    [
        pytest.param([], "f.yaml", "", id="none"),
        pytest.param([("a.b", "bad")], "f.yaml", "f.yaml: a.b: bad\n", id="one"),
        pytest.param([("a", "x"), ("b[0].c", "y")], None, "a: x\nb[0].c: y\n", id="no-file"),
    ],
)
def test_format_problems(problems: list[tuple[str, str]], file: str | None, expected: str) -> None:
    assert format_problems(problems, file) == expected
