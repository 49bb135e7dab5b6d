"""The adapter's config as plain records (gpuwarden/config/view.py): validated in a child process by the
same loader, read back with every field and value the models give (a `Path` stays a `Path`), problems still
named by field; preset rules built without the models equal what the models make of them. And the guard of
issue 29: the adapter's entry point, config loading and assembly import no pydantic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from adapter import engines, presets
from gpuwarden.config.adapter import Presets
from gpuwarden.config.export import encode
from gpuwarden.config.loader import load_config
from gpuwarden.config.metric_rules import DiscoveryRule
from gpuwarden.config.view import ExportFailed, Record, decode, load_in_child, loads

SECTIONS = ("prometheus", "kubernetes", "adapter", "logging")

CONFIG: dict[str, Any] = {
    "prometheus": {
        "url": "https://prom.example:9090/sub",
        "headers": {"X-Scope-OrgID": "team-a"},
        "tls": {"ca_file": "/etc/ca.pem"},
        "bearer_token_file": "/var/run/token",
    },
    "kubernetes": {"kubeconfig": "/etc/kube/config", "qps": 50, "burst": 100},
    "adapter": {
        "rules": [
            {
                "seriesQuery": 'http_requests_total{namespace!=""}',
                "seriesFilters": [{"isNot": "^go_.*"}],
                "resources": {
                    "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
                },
                "name": {"matches": "^(.*)_total$", "as": "${1}_per_second"},
                "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)",
            }
        ],
        "tls": {"cert_file": "/tls/tls.crt", "key_file": "/tls/tls.key"},
        "authentication": {"requestheader_allowed_names": ["front-proxy-client"]},
        "resourceRules": {
            "cpu": {
                "containerQuery": "sum(rate(c{<<.LabelMatchers>>}[3m])) by (<<.GroupBy>>)",
                "nodeQuery": "sum(rate(n{<<.LabelMatchers>>}[3m])) by (<<.GroupBy>>)",
                "resources": {"template": "<<.Resource>>"},
                "containerLabel": "container",
            },
            "memory": {
                "containerQuery": "sum(m{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
                "nodeQuery": "sum(nm{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
                "resources": {"template": "<<.Resource>>"},
                "containerLabel": "container",
            },
            "window": "3m",
        },
    },
    "logging": {"level": "warning", "format": "json"},
}


def same(model: Any, record: Any, where: str = "") -> None:
    """Every field of `model` is in `record` with an equal value of the same type."""
    if isinstance(model, BaseModel):
        assert isinstance(record, Record), where
        for name in type(model).model_fields:
            same(getattr(model, name), getattr(record, name), f"{where}.{name}")
    elif isinstance(model, dict):
        assert isinstance(record, dict) and set(record) == set(model), where
        for key in model:
            same(model[key], record[key], f"{where}[{key}]")
    elif isinstance(model, list | tuple):
        assert isinstance(record, list) and len(record) == len(model), where
        for i, (m, r) in enumerate(zip(model, record, strict=True)):
            same(m, r, f"{where}[{i}]")
    elif type(model).__module__.startswith("pydantic"):  # HttpUrl: the serving code reads str(url)
        assert record == str(model), where
    else:
        assert type(record) is type(model) and record == model, where


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_records_hold_every_field_and_value_of_the_models(config_file: Path) -> None:
    config = load_config(config_file, {})
    for name in SECTIONS:
        same(getattr(config, name), decode(encode(getattr(config, name))), name)
    assert isinstance(decode(encode(config.adapter)).tls.cert_file, Path)


def test_child_loads_with_env_and_overrides(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_ADAPTER__RELIST_INTERVAL_SECONDS", "45")
    view = load_in_child(config_file, {"adapter.secure_port": 7443, "logging.level": None}, SECTIONS)
    expected = load_config(
        config_file,
        {"GPUWARDEN_ADAPTER__RELIST_INTERVAL_SECONDS": "45"},
        {"adapter.secure_port": 7443, "logging.level": None},
    )
    for name in SECTIONS:
        same(getattr(expected, name), getattr(view, name), name)
    assert view.adapter.secure_port == 7443 and view.adapter.relist_interval_seconds == 45.0
    assert view.logging.level == "warning"
    with pytest.raises(AttributeError):
        _ = view.health  # only the sections asked for


def test_child_reports_every_problem_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("adapter:\n  secure_port: 99999\n  relist_interval: 5\n")
    with pytest.raises(ExportFailed) as info:
        load_in_child(path, {}, SECTIONS)
    assert "adapter.secure_port" in info.value.text
    assert "adapter.relist_interval" in info.value.text


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"a": 1}', id="untagged-root"),
        pytest.param('{"$record": {"x": {"$set": []}}}', id="unknown-tag"),
        pytest.param('{"$record": {"x": {"$path": "/a", "$map": {}}}}', id="two-tags"),
    ],
)
def test_loads_rejects_what_encode_never_writes(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


def test_records_are_frozen() -> None:
    record = Record({"a": 1})
    with pytest.raises(AttributeError):
        record.a = 2  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        _ = record.b  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param({}, id="defaults"),
        pytest.param(
            {
                "dcgm_pod_label": "exported_pod",
                "dcgm_namespace_label": "exported_namespace",
                "gpu_utilization": {"source": "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "name": "util"},
                "requests_per_second": {"series": "app_requests_total", "rate_window_seconds": 60},
            },
            id="changed",
        ),
    ],
)
def test_preset_records_equal_what_the_model_makes_of_them(cfg: dict[str, Any]) -> None:
    model_presets = Presets.model_validate(cfg)
    documents = presets.preset_documents(model_presets, 90) + presets.external_preset_documents(model_presets)
    assert len(documents) == 4 + len(engines.catalog(model_presets.engines.engines))
    for document in documents:
        model = DiscoveryRule.model_validate(document)
        same(model, presets.rule_record(document))


def test_adapter_entry_point_and_assembly_import_no_pydantic_or_cryptography(
    config_file: Path, tmp_path: Path
) -> None:
    """Issue 29 (adapter RSS): pydantic and the config models cost ~13 MiB, cryptography ~7.5. Import what
    `gpuwarden adapter` imports, load the config as it does, build the adapter (without Kubernetes) and
    its serving TLS context (a self-signed pair: made in a child process)."""
    cfg = {
        "prometheus": {"url": "http://127.0.0.1:9090"},
        "adapter": {k: v for k, v in CONFIG["adapter"].items() if k != "tls"},
    }
    config_file.write_text(yaml.safe_dump(cfg))
    code = (
        "import sys\n"
        "import gpuwarden.cli, adapter.app\n"
        "from pathlib import Path\n"
        "from gpuwarden.config.view import load_in_child\n"
        f"config = load_in_child(Path({str(config_file)!r}), {{}}, {SECTIONS!r})\n"
        "adapter.app.Adapter(config).serving_context()\n"
        "heavy = ('pydantic', 'pydantic_core', 'cryptography')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "bad += sorted(m for m in sys.modules if m.startswith('gpuwarden.config.') and m not in "
        "('gpuwarden.config.view', 'gpuwarden.config.templatefields'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_gpuwarden_adapter_prints_the_childs_problems_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("adapter:\n  secure_port: 99999\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "adapter", f"--config={path}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert str(path) in done.stderr and "adapter.secure_port" in done.stderr
