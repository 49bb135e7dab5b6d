"""Child processes of the demo: `gpuwarden simulate`, `gpuwarden adapter`, `gpuwarden controller`.

Why it exists: the demo runs the real deployables as separate processes, exactly as a user would start them
(same CLI, same config file), so what the demo shows is what ships. Each child gets its own session (so a
Ctrl-C in the terminal reaches the demo, which then stops the children in order), a log file, and is
stopped by its own pid only: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_all: list[ManagedProcess] = []


class ProcessFailed(RuntimeError):
    """A child exited or never became ready; the message carries its log tail."""


@dataclass
class ManagedProcess:
    """One child process with its log file."""

    name: str
    args: list[str]
    log_path: Path
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        env.pop("KUBECONFIG", None)  # the config file names the demo's kubeconfig; never the user's cluster
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=env,
                start_new_session=True,
            )
        _all.append(self)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessFailed(
                f"{self.name} exited with status {self.proc.returncode}; last lines of {self.log_path}:\n"
                f"{self.log_tail()}"
            )

    async def wait_ready(self, url: str, *, within: float = 60.0, cafile: Path | None = None) -> None:
        """Poll `url` until it answers 200; fail early (with the log tail) if the process exits."""
        verify: ssl.SSLContext | bool = False
        if cafile is not None:
            verify = ssl.create_default_context(cafile=str(cafile))
            verify.check_hostname = False
        deadline = time.monotonic() + within
        last = "no answer"
        async with httpx.AsyncClient(timeout=2.0, verify=verify, trust_env=False) as http:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    response = await http.get(url)
                    if response.status_code == 200:
                        return
                    last = f"HTTP {response.status_code}: {response.text.strip()[:200]}"
                except httpx.HTTPError as exc:
                    last = repr(exc)
                await asyncio.sleep(0.3)
        raise ProcessFailed(
            f"{self.name} not ready at {url} after {within:.0f}s ({last}):\n{self.log_tail()}"
        )

    def stop(self, grace: float = 8.0) -> None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; idempotent."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=5)


def gpuwarden_command(*args: str) -> list[str]:
    """`gpuwarden ...` from the running interpreter's environment (the venv), without relying on PATH."""
    return [sys.executable, "-m", "gpuwarden", *args]


def stop_all() -> None:
    """Stop every child still running, newest first (controller before adapter before simulator)."""
    for child in reversed(_all):
        child.stop()
    _all.clear()
