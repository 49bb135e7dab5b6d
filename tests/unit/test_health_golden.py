"""Golden files for the health loop's wire formats: the PromQL it sends and the plan JSON it prints.

Regenerate after an intended change with `GPUWARDEN_UPDATE_GOLDEN=1 pytest tests/unit/test_health_golden.py`
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from controller.health.decide import plan_quarantine
from controller.health.policy import HealthPolicy, policy_from_config
from controller.health.snapshot import FleetSnapshot
from controller.health.telemetry import build_queries
from gpuwarden.config.health import HealthConfig
from tests.unit.test_health_fixtures import NOW, node, quarantined

GOLDEN = Path(__file__).parent / "golden" / "health"


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} differs; regenerate with GPUWARDEN_UPDATE_GOLDEN=1 if intended"


def test_default_queries() -> None:
    check("queries_default.json", json.dumps(build_queries(HealthConfig()).all(), indent=2) + "\n")


def test_queries_with_relabelled_node_label_and_matchers() -> None:
    cfg = HealthConfig.model_validate(
        {"node_labels": ["node"], "gpu_uuid_label": "uuid", "label_matchers": 'cluster="prod"',
         "xid": {"source": "count"}}
    )  # fmt: skip
    check("queries_node_label.json", json.dumps(build_queries(cfg).all(), indent=2) + "\n")


def test_plan_json_and_table() -> None:
    nodes = (
        node("a-xid79", per_gpu={0: {"xids": (79,)}}),
        node("b-xid13", per_gpu={1: {"xids": (13,)}}),
        node("c-unknown", telemetry=False),
        quarantined("d-healed", healthy_since=NOW - 7200, boot_id="boot-2"),
        node("e-ok"),
    )
    plan = plan_quarantine(FleetSnapshot(NOW, nodes), HealthPolicy(), NOW)
    check("plan_mixed.json", json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n")
    check("plan_mixed.txt", plan.render_table())


def test_policy_from_default_config_matches_policy_defaults() -> None:
    assert policy_from_config(HealthConfig()) == HealthPolicy()


def test_decide_imports_no_io_module() -> None:
    """decide.py (and what it imports) must load without any client library: it is the pure core."""
    import subprocess
    import sys

    code = (
        "import sys, controller.health.decide\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'httpx', 'kubernetes', 'adapter')"
        " or m.startswith(('gpuwarden.promclient', 'gpuwarden.kube'))]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_subquery_step_comes_from_the_config() -> None:
    cfg = HealthConfig.model_validate({"subquery_step_seconds": 30})
    assert build_queries(cfg).all() == build_queries(HealthConfig(), step=30).all()
    assert build_queries(cfg).all() != build_queries(HealthConfig()).all()
