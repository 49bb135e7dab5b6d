"""The node agent's lean config loader never judges: what it accepts, the models accept with the same
values; what it is unsure of goes to the full loader (whose errors name the field). Also the regression
guard of issue 29: the node agent's entry point imports neither pydantic, aiohttp nor `kubernetes`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gpuwarden.config.kubernetes import KubernetesConfig
from gpuwarden.config.lean import (
    LEAN_SECTIONS,
    LeanDevicePlugin,
    LeanKubernetes,
    LeanLogging,
    LeanNodeAgent,
    field_names,
    lean_config,
    load_lean,
)
from gpuwarden.config.loader import load_config
from gpuwarden.config.logging import LoggingConfig
from gpuwarden.config.node_agent import DevicePluginConfig, NodeAgentConfig
from gpuwarden.errors import ConfigError

MODELS: dict[type, type[BaseModel]] = {
    LeanNodeAgent: NodeAgentConfig,
    LeanDevicePlugin: DevicePluginConfig,
    LeanKubernetes: KubernetesConfig,
    LeanLogging: LoggingConfig,
}
COMPLETE = {LeanNodeAgent, LeanDevicePlugin}
"""Sections read in full (a field added to the model must be added here, or the lean path would reject a
valid file for ever); the others read a subset and leave the rest to the full loader."""


@pytest.mark.parametrize("lean", list(MODELS), ids=lambda c: c.__name__)
def test_same_fields_and_defaults_as_the_models(lean: type) -> None:
    model = MODELS[lean]
    names = field_names(lean)
    accepted = set(LEAN_SECTIONS[lean]) | ({"device_plugin"} if lean is LeanNodeAgent else set())
    assert names == accepted
    if lean in COMPLETE:
        assert names == set(model.model_fields)
    assert names <= set(model.model_fields)
    default, ours = model(), lean()
    for name in names - {"device_plugin"}:
        assert getattr(ours, name) == getattr(default, name), name


def _values(obj: Any, names: set[str]) -> dict[str, Any]:
    return {n: getattr(obj, n) for n in names}


ACCEPTED = [
    pytest.param({}, id="empty"),
    pytest.param({"node_agent": None, "logging": None}, id="empty-sections"),
    pytest.param(
        {"node_agent": {"device_id_strategy": "uuid", "topology_source": "auto", "listen": "0.0.0.0:9402",
                        "kubelet_root_dir": "/var/lib/kubelet", "device_plugin": {"enabled": False}},
         "logging": {"format": "json"}},
        id="the-chart-configmap",
    ),
    pytest.param(
        {"node_agent": {"topology_source": "file", "topology_file": "/t.yaml", "dry_run": "true",
                        "reconcile_interval_seconds": "0.5", "min_read_interval_seconds": 1,
                        "device_plugin": {"enabled": "TRUE", "socket_name": "x.sock",
                                          "admission_wait_seconds": "2.5", "device_nodes": True}},
         "kubernetes": {"kubeconfig": "/k", "context": "c", "request_timeout_seconds": 10,
                        "field_manager": "fm"},
         "logging": {"level": "ERROR", "format": "text"}},
        id="strings-as-env-and-flags-give-them",
    ),
]  # fmt: skip


def full(tmp_path: Path, raw: dict[str, Any]) -> Any:
    """The full loader's reading of `raw` as a file."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path, {})


@pytest.mark.parametrize("raw", ACCEPTED)
def test_what_the_lean_loader_accepts_the_models_accept_alike(tmp_path: Path, raw: dict[str, Any]) -> None:
    ours = lean_config(raw)
    assert ours is not None
    theirs = full(tmp_path, raw)
    for section, lean in (
        ("node_agent", LeanNodeAgent),
        ("kubernetes", LeanKubernetes),
        ("logging", LeanLogging),
    ):
        names = field_names(lean) - {"device_plugin"}
        assert _values(getattr(ours, section), names) == _values(getattr(theirs, section), names)
    plugin = field_names(LeanDevicePlugin)
    assert _values(ours.node_agent.device_plugin, plugin) == _values(theirs.node_agent.device_plugin, plugin)
    assert ours.node_agent.pod_resources_path == theirs.node_agent.pod_resources_path


def agent(**fields: Any) -> dict[str, Any]:
    return {"node_agent": fields}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(agent(dry_rn=True), "node_agent.dry_rn", id="unknown-key"),
        pytest.param(agent(listen="9402"), "node_agent.listen", id="pattern"),
        pytest.param(agent(reconcile_interval_seconds=0.1), "node_agent.reconcile_interval_seconds", id="ge"),
        pytest.param(
            agent(min_read_interval_seconds=True), "node_agent.min_read_interval_seconds", id="bool"
        ),
        pytest.param(agent(device_id_strategy="UUID"), "node_agent.device_id_strategy", id="literal"),
        pytest.param(agent(topology_source="file"), "node_agent.topology_file", id="cross-field"),
        pytest.param(
            agent(device_plugin={"socket_name": "x"}), "node_agent.device_plugin.socket_name", id="nested"
        ),
        pytest.param(agent(dry_run="maybe"), "node_agent.dry_run", id="bool-string"),
        pytest.param({"kubernetes": {"field_manager": ""}}, "kubernetes.field_manager", id="min-length"),
        pytest.param({"logging": {"level": "trace"}}, "logging.level", id="level"),
        pytest.param({"node_agent": []}, "node_agent", id="section-not-a-mapping"),
    ],
)
def test_what_it_is_unsure_of_goes_to_the_models_whose_error_names_the_field(
    tmp_path: Path, raw: dict[str, Any], field: str
) -> None:
    assert lean_config(raw) is None
    with pytest.raises(ConfigError) as info:
        full(tmp_path, raw)
    assert field in [name for name, _ in info.value.problems]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"health": {"enabled": True}}, id="another-section"),
        pytest.param({"kubernetes": {"qps": 5}}, id="a-kubernetes-field-not-read-here"),
        pytest.param({"logging": {"loggers": {"grpc": "debug"}}}, id="per-logger-levels"),
        pytest.param({"node_agent": {"dry_run": 1}}, id="int-as-bool-left-to-the-models"),
    ],
)
def test_valid_but_beyond_the_lean_reading_goes_to_the_models(raw: dict[str, Any]) -> None:
    assert lean_config(raw) is None


def test_file_env_and_flags_in_the_full_loaders_order(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("node_agent:\n  listen: 0.0.0.0:1\n  dry_run: false\n")
    env = {"GPUWARDEN_NODE_AGENT__DRY_RUN": "true", "GPUWARDEN_NODE_AGENT__LISTEN": "0.0.0.0:2"}
    flags = {"node_agent.listen": "127.0.0.1:3", "logging.level": None}
    ours = load_lean(path, env, flags)
    theirs = load_config(path, env, flags)
    assert ours is not None
    assert (ours.node_agent.listen, ours.node_agent.dry_run) == ("127.0.0.1:3", True)
    assert (theirs.node_agent.listen, theirs.node_agent.dry_run) == ("127.0.0.1:3", True)


@pytest.mark.parametrize(
    ("text", "env"),
    [
        pytest.param("node_agent:\n  dry_run: true\n  dry_run: false\n", {}, id="duplicate-key"),
        pytest.param("node_agent: [\n", {}, id="syntax-error"),
        pytest.param("", {"GPUWARDEN_NODE_AGENT_DRY_RUN": "true"}, id="misspelt-env"),
    ],
)
def test_file_problems_go_to_the_full_loader(tmp_path: Path, text: str, env: dict[str, str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert load_lean(path, env) is None
    with pytest.raises(ConfigError):
        load_config(path, env)


def test_node_agent_entry_point_imports_no_pydantic_aiohttp_kubernetes_or_prometheus_client() -> None:
    """Issue 29 (node agent idle RSS ≤ 40 MiB): these cost ~13, ~10, ~18 and ~3 MiB. Import what
    `gpuwarden node-agent` imports, load a plainly valid config, build the agent's Kubernetes client."""
    code = (
        "import sys, os, pathlib, tempfile\n"
        "import gpuwarden.cli, nodeagent.app\n"
        "from gpuwarden.config.lean import load_lean\n"
        "from nodeagent.app import kube_client\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "(d / 'c.yaml').write_text('node_agent:\\n  listen: 0.0.0.0:9402\\nlogging:\\n  format: json\\n')\n"
        "(d / 'k').write_text(\"clusters: [{name: c, cluster: {server: 'https://h:6443'}}]\\n"
        "users: [{name: u, user: {token: t}}]\\ncontexts: [{name: c, context: {cluster: c, user: u}}]\\n"
        'current-context: c\\n")\n'
        "config = load_lean(d / 'c.yaml', {}, {'kubernetes.kubeconfig': str(d / 'k')})\n"
        "assert config is not None\n"
        "kube_client(config)\n"
        "heavy = ('pydantic', 'pydantic_core', 'kubernetes', 'aiohttp', 'urllib3', 'prometheus_client')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
