"""A real Prometheus server on a loopback port, started and stopped from Python (tests, bench and the demo).

Why this module exists: the integration tier and `gpuwarden demo` need a genuine Prometheus (the Debian
`prometheus` package) rather than a fake, with a generated config, a private TSDB under a work directory, and
— for exact values at exact times — history backfilled with `promtool tsdb create-blocks-from openmetrics`.
One implementation keeps the tests and the demo honest about the same server.

The process is a plain `subprocess.Popen` polled with `asyncio.sleep`, not an asyncio subprocess, so a server
started on one event loop can be stopped from another (pytest-asyncio runs module fixtures on their own loop).
What it must not do: talk to any Prometheus but its own, or bind anything but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from gpuwarden import ports
from gpuwarden.config.prometheus import PrometheusConfig
from gpuwarden.errors import GpuwardenError, PrometheusError
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Vector

HOST = "127.0.0.1"
INSTALL_HINT = "run `make prometheus` (installs the Debian `prometheus` package: server and promtool)"
_POLL_SECONDS = 0.05
_running: set[subprocess.Popen[bytes]] = set()


class LocalPrometheusError(GpuwardenError):
    """The local Prometheus could not be set up, started, or did not reach the expected state."""


def storage_dir(workdir: Path) -> Path:
    """Where the TSDB of a `LocalPrometheus(workdir)` lives; `backfill_openmetrics` writes blocks here."""
    return workdir / "data"


def find_free_port() -> int:
    """A TCP port free on 127.0.0.1, never handed out before in this process (`gpuwarden.ports`)."""
    return ports.free_port(HOST)


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise LocalPrometheusError(f"`{binary}` not found on PATH; {INSTALL_HINT}")
    return path


def _duration(seconds: float) -> str:
    """Prometheus' config duration format (integer units): 1.0 -> "1000ms"."""
    return f"{max(round(seconds * 1000), 1)}ms"


def scrape_target(
    job: str,
    host_port: str | Sequence[str],
    *,
    metrics_path: str = "/metrics",
    scrape_interval_seconds: float | None = None,
    honor_labels: bool = False,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One `scrape_configs` entry with static targets, e.g. `scrape_target("sim", "127.0.0.1:9400")`."""
    targets = [host_port] if isinstance(host_port, str) else list(host_port)
    static: dict[str, Any] = {"targets": targets}
    if labels:
        static["labels"] = dict(labels)
    config: dict[str, Any] = {
        "job_name": job,
        "metrics_path": metrics_path,
        "honor_labels": honor_labels,
        "static_configs": [static],
    }
    if scrape_interval_seconds is not None:
        config["scrape_interval"] = _duration(scrape_interval_seconds)
        config["scrape_timeout"] = _duration(scrape_interval_seconds)
    return config


def backfill_openmetrics(workdir: Path, text: str, *, timeout: float = 120.0) -> Path:
    """Write OpenMetrics `text` as TSDB blocks into `storage_dir(workdir)`; call before `start()`.

    Timestamps are unix seconds and must lie before the head (a few hours in the past is safe); query them
    with an explicit `time=`. `# EOF` is appended when missing. Returns the storage directory.
    """
    promtool = _require("promtool")
    workdir.mkdir(parents=True, exist_ok=True)
    storage = storage_dir(workdir)
    storage.mkdir(exist_ok=True)
    if not text.rstrip().endswith("# EOF"):
        text = text.rstrip("\n") + "\n# EOF\n"
    source = workdir / f"backfill-{time.monotonic_ns()}.om"
    source.write_text(text, encoding="utf-8")
    cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(storage)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise LocalPrometheusError(f"promtool backfill failed ({done.returncode}): {done.stderr[-2000:]}")
    return storage


class LocalPrometheus:
    """A Prometheus server on 127.0.0.1:<free port> with its config and TSDB under `workdir`."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: Sequence[Mapping[str, Any]] | None = None,
        scrape_interval_seconds: float = 1.0,
        rule_files: Sequence[Path] = (),
        retention: str = "7d",
        *,
        self_scrape: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        """`self_scrape` adds job "prometheus" scraping this server, for tests that need live series."""
        self.workdir = workdir
        self.scrape_configs = [dict(c) for c in scrape_configs or ()]
        self.scrape_interval_seconds = scrape_interval_seconds
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.retention = retention
        self.self_scrape = self_scrape
        self.extra_args = list(extra_args)
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. http://127.0.0.1:41234."""
        if self._port is None or self._proc is None:
            raise LocalPrometheusError("LocalPrometheus is not running; call start() first")
        return f"http://{HOST}:{self._port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def client(self, registry: CollectorRegistry | None = None, **config: Any) -> PrometheusClient:
        """A `PrometheusClient` for this server; `config` overrides `PrometheusConfig` fields."""
        return PrometheusClient(
            PrometheusConfig.model_validate({"url": self.url, **config}), registry=registry
        )

    def write_config(self) -> None:
        """(Re)write prometheus.yml from the current settings; `reload()` applies it to a running server."""
        scrape_configs = list(self.scrape_configs)
        if self.self_scrape and self._port is not None:
            scrape_configs.append(scrape_target("prometheus", f"{HOST}:{self._port}"))
        interval = _duration(self.scrape_interval_seconds)
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": scrape_configs,
        }
        self.config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")  # JSON is YAML

    async def start(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 (a budget, not a wrapper)
        """Spawn the server and wait for /-/ready; on failure raise with the log tail. Retries a lost port."""
        if self.running:
            return
        binary = _require("prometheus")
        storage_dir(self.workdir).mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        for _ in range(3):
            self._port = find_free_port()
            self.write_config()
            self._proc = self._spawn(binary)
            _running.add(self._proc)
            if await self._wait_ready(deadline):
                return
        raise LocalPrometheusError(f"prometheus could not bind a free port:\n{self.log_tail()}")

    def _spawn(self, binary: str) -> subprocess.Popen[bytes]:
        """Fork/exec only (no waiting), so it is fine to call from the event loop."""
        args = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={storage_dir(self.workdir)}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address={HOST}:{self._port}",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]
        with self.log_path.open("ab") as log:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    async def _wait_ready(self, deadline: float) -> bool:
        """True once ready; False if the port was taken meanwhile; raises on any other failure."""
        assert self._proc is not None
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while True:
                code = self._proc.poll()
                if code is not None:
                    _running.discard(self._proc)
                    if "address already in use" in self.log_tail(10):
                        return False
                    raise LocalPrometheusError(f"prometheus exited with status {code}:\n{self.log_tail()}")
                try:
                    if (await http.get(f"{self.url}/-/ready")).status_code == 200:
                        return True
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    await self.stop()
                    raise LocalPrometheusError(f"prometheus not ready in time:\n{self.log_tail()}")
                await asyncio.sleep(_POLL_SECONDS)

    async def reload(self) -> None:
        """Rewrite the config and ask the running server to load it (POST /-/reload)."""
        self.write_config()
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
            response = await http.post(f"{self.url}/-/reload")
        if response.status_code != 200:
            raise LocalPrometheusError(f"reload failed ({response.status_code}): {response.text.strip()}")

    async def wait_for_up(self, job: str, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Poll until every target of `job` has been scraped successfully (`up == 1`), or raise."""
        deadline = time.monotonic() + timeout
        last: object = "no answer"
        async with self.client(timeout_seconds=5, retries=0) as prom:
            while time.monotonic() < deadline:
                try:
                    result = await prom.query(f'up{{job="{job}"}}')
                    last = result
                    if (
                        isinstance(result, Vector)
                        and result.samples
                        and all(s.value == 1 for s in result.samples)
                    ):
                        return
                except PrometheusError as exc:
                    last = exc
                await asyncio.sleep(_POLL_SECONDS * 4)
        raise LocalPrometheusError(f"job {job!r} not up within {timeout}s (last: {last}):\n{self.log_tail()}")

    async def stop(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """SIGTERM, wait up to `timeout`, then SIGKILL. Idempotent; keeps the workdir (and its TSDB)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        _running.discard(proc)

    async def __aenter__(self) -> LocalPrometheus:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


@atexit.register
def _kill_leftovers() -> None:
    """A crashed test run must not leave servers behind."""
    for proc in list(_running):
        if proc.poll() is None:
            proc.kill()
