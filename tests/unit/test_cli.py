"""The CLI surface: every documented command is listed, unbuilt ones refuse loudly (exit 2)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden import cli

COMMANDS = ["adapter", "controller", "plan", "check-config", "simulate", "demo"]


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"\n  {name} " in out, name


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == cli.EXIT_USAGE
    assert "check-config" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        pytest.param("adapter", ["--config", "--prometheus-url", "--secure-port"], id="adapter"),
        pytest.param("controller", ["--config", "--prometheus-url", "--dry-run"], id="controller"),
        pytest.param("plan", ["--config", "--kubeconfig", "--output"], id="plan"),
        pytest.param("simulate", ["--scenario", "--listen"], id="simulate"),
        pytest.param("demo", ["--scenario", "--keep", "--out"], id="demo"),
    ],
)
def test_each_command_documents_its_flags(
    command: str, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in flags:
        assert flag in out, (command, flag)


def test_bad_config_names_every_field_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("prometheus:\n  timeout_seconds: -1\nhealth:\n  no_such_key: 1\n")
    assert cli.main(["plan", "--config", str(bad)]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "prometheus.timeout_seconds" in err
    assert "health.no_such_key" in err


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpuwarden ")


def test_simulate_rejects_bad_listen(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulate"])  # --scenario is required
    assert exc.value.code == 2
    assert "--scenario" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["plan", "--kubeconfig", "/tmp/kc.yaml"], "/tmp/kc.yaml", id="flag-wins"),
        pytest.param(["plan"], None, id="default-in-cluster"),
    ],
)
def test_kubeconfig_flag_overrides_the_config(
    argv: list[str], expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUWARDEN_KUBERNETES__KUBECONFIG", raising=False)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", root.handlers[:])  # _load configures logging; undo it afterwards
    monkeypatch.setattr(root, "level", root.level)
    config = cli._load(cli.build_parser().parse_args(argv), {})
    assert config is not None
    got = config.kubernetes.kubeconfig
    assert (str(got) if got is not None else None) == expected
