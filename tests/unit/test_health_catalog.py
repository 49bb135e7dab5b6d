"""The shipped XID catalog (controller/data/xid_catalog.yaml) and config overrides."""

from __future__ import annotations

import pytest

from controller.health.catalog import default_catalog, load_catalog, parse_catalog
from gpuwarden.config.health import XidOverride
from gpuwarden.errors import ConfigError

CAT = default_catalog()


@pytest.mark.parametrize(
    ("code", "cls", "action", "quarantine", "escalate"),
    [
        pytest.param(13, "app", "RESTART_APP", False, None, id="13-app"),
        pytest.param(31, "app", "RESTART_APP", False, None, id="31-app"),
        pytest.param(43, "app", "IGNORE", False, None, id="43-app-ignore"),
        pytest.param(45, "app", "WORKFLOW_XID_45", False, None, id="45-never-escalates"),
        pytest.param(68, "app", "RESTART_APP", False, None, id="68-app"),
        pytest.param(48, "hw_mem", "WORKFLOW_XID_48", True, None, id="48-dbe"),
        pytest.param(64, "hw_mem", "RESET_GPU", True, None, id="64-remap-failure"),
        pytest.param(74, "hw_link", "WORKFLOW_NVLINK_ERR", True, None, id="74-nvlink"),
        pytest.param(79, "hw_pcie", "RESTART_BM", True, None, id="79-off-the-bus"),
        pytest.param(95, "hw_mem", "RESET_GPU", True, None, id="95-uncontained"),
        pytest.param(119, "fw_drv", "RESET_GPU", True, None, id="119-gsp-timeout"),
        pytest.param(120, "fw_drv", "RESET_GPU", True, None, id="120-gsp"),
        pytest.param(140, "hw_mem", "RESET_GPU", True, None, id="140-ecc-escape"),
        pytest.param(32, "app", "RESTART_APP", False, 3, id="32-escalates"),
        pytest.param(94, "hw_mem", "RESTART_APP", False, 3, id="94-escalates"),
        pytest.param(63, "info", "IGNORE", False, None, id="63-info"),
        pytest.param(145, "hw_link", "WORKFLOW_NVLINK5_ERR", False, 3, id="145-nvlink5"),
    ],
)
def test_defaults_follow_appendix_b(
    code: int, cls: str, action: str, quarantine: bool, escalate: int | None
) -> None:
    e = CAT.lookup(code)
    assert (e.xid_class, e.action, e.quarantine, e.escalate_after) == (cls, action, quarantine, escalate)


def test_every_in_use_catalog_bucket_is_covered() -> None:
    assert len(CAT) >= 100
    for e in CAT:
        if e.action in ("RESET_GPU", "RESTART_BM", "RESTART_VM"):
            assert e.quarantine, e.code
        if e.action in ("RESTART_APP", "IGNORE"):
            assert not e.quarantine, e.code


def test_79_needs_a_reboot_to_clear() -> None:
    assert CAT.lookup(79).recovery == "reboot"
    assert CAT.lookup(48).recovery == "reset"


def test_unknown_code_is_reported_never_quarantined() -> None:
    e = CAT.lookup(999)
    assert e.xid_class == "unknown" and not e.quarantine and e.reason == "xid-999"


def test_config_override_models_merge_per_field() -> None:
    merged = load_catalog(
        {109: XidOverride(quarantine=False), 13: XidOverride.model_validate({"escalate_after": 2})}
    )
    assert not merged.lookup(109).quarantine and merged.lookup(109).action == "RESET_GPU"
    assert merged.lookup(13).escalate_after == 2 and merged.lookup(13).xid_class == "app"
    assert CAT.lookup(109).quarantine  # the default is untouched


def test_override_of_a_code_not_in_the_catalog() -> None:
    merged = load_catalog({999: {"class": "hw_pcie", "quarantine": True}})
    assert merged.lookup(999).quarantine and merged.lookup(999).xid_class == "hw_pcie"


def test_bad_overrides_are_all_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        load_catalog({13: {"class": "nonsense"}, 31: {"escalate_after": 0}})
    fields = [f for f, _ in err.value.problems]
    assert any(f.startswith("health.xid_overrides.13") for f in fields)
    assert any(f.startswith("health.xid_overrides.31") for f in fields)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("[]", "top-level `xids:`", id="not-a-mapping"),
        pytest.param("xids: {x: {}}", "expected", id="code-not-int"),
        pytest.param("xids: {1: {class: app}}", "xids.1.action", id="missing-fields"),
    ],
)
def test_bad_catalog_files_name_the_field(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_catalog(text, "cat.yaml")
    assert problem in str(err.value)
