"""deploy/dcgm-exporter/dcgm-metrics.csv turns on every DCGM field the health loop queries (and the adapter's
presets read), in dcgm-exporter's CSV format; nothing gpuwarden reads is left to the exporter's defaults."""

from __future__ import annotations

import re
from pathlib import Path

from controller.health.telemetry import build_queries
from gpuwarden.config.health import HealthConfig

CSV = Path(__file__).resolve().parents[2] / "deploy" / "dcgm-exporter" / "dcgm-metrics.csv"
# The health loop reads the recovery action under either name (DCGM renamed the field); the CSV needs one.
ALIASES = {"DCGM_FI_DEV_GPU_RECOVERY_ACTION": "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"}


def csv_fields() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in CSV.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, help_ = (part.strip() for part in line.split(",", 2))
        assert name not in out, f"{name} listed twice"
        assert kind in ("gauge", "counter"), line
        assert help_, line
        out[name] = kind
    return out


def test_every_queried_field_is_enabled() -> None:
    queried = set()
    for promql in build_queries(HealthConfig()).all().values():
        queried |= set(re.findall(r"\b(DCGM_(?:FI|EXP)_[A-Z0-9_]+)\b", promql))
    queried = {ALIASES.get(name, name) for name in queried}
    assert queried - set(csv_fields()) == set()
    assert len(queried) >= 20  # the regex found the fields, not nothing (24 today)


def test_adapter_preset_fields_are_enabled() -> None:
    fields = csv_fields()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED",
                 "DCGM_FI_DEV_FB_FREE"):  # fmt: skip
        assert name in fields


def test_counters_are_declared_counters() -> None:
    fields = csv_fields()
    for name in ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"):  # fmt: skip
        assert fields[name] == "counter", name
