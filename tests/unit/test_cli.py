"""The CLI surface: every documented command is listed, unbuilt ones refuse loudly (exit 2)."""

from __future__ import annotations

import subprocess
import sys

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
    ("argv", "issue"),
    [
        pytest.param(["demo"], 9, id="demo"),
    ],
)
def test_unbuilt_commands_say_so_and_exit_2(
    argv: list[str], issue: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "not built yet" in err
    assert f"issue {issue}" in err


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
