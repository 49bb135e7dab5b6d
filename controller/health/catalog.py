"""The XID catalog: what one XID code means for the node that reported it.

Why data, not code: NVIDIA revises its Xid catalog, and every fleet disagrees with someone's classification
(XID 109 is fatal for NVSentinel and ignored by the device plugin). The defaults ship as
`controller/data/xid_catalog.yaml` (reference/gpu-health.md Appendix B); operators override single fields per
code in config (`health.xid_overrides`) without copying the whole table.

What it must not do: no I/O beyond reading the packaged YAML once, no decisions. Whether a node is quarantined
is `decide.py`'s business; this module only answers "what is XID n?". A code that is not in the catalog is
reported as unknown (class `unknown`, never quarantined) rather than guessed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuwarden.errors import ConfigError

XidClass = Literal["app", "hw_mem", "hw_pcie", "hw_link", "fw_drv", "info", "unused", "unknown"]
Recovery = Literal["reset", "reboot", "none"]
XID_CLASSES: tuple[str, ...] = ("app", "hw_mem", "hw_pcie", "hw_link", "fw_drv", "info", "unused", "unknown")


class XidEntry(BaseModel):
    """One catalog row. `quarantine` acts on one occurrence; `escalate_after` on repetition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: int = Field(ge=0, description="The XID number.")
    xid_class: XidClass = Field(alias="class", description="Selects the taint effect (health.taint_effects).")
    action: str = Field(description="NVIDIA's immediate action bucket, e.g. RESET_GPU, RESTART_APP.")
    quarantine: bool = Field(description="Taint the node on a single occurrence.")
    escalate_after: int | None = Field(
        default=None,
        ge=1,
        description="Taint when this many occurrences on one GPU fall within health.repeat_window; "
        "null never escalates (application XIDs such as 45 must not).",
    )
    recovery: Recovery = Field(
        default="reset",
        description="What clears the quarantine after the healthy period: `reset` (XID value or volatile "
        "counters reset, or a reboot), `reboot` (only a new bootID), `none` (only the operator).",
    )
    mnemonic: str = ""
    description: str = ""
    note: str = ""

    @property
    def reason(self) -> str:
        """The reason string used in taints, annotations and metrics, e.g. `xid-79`."""
        return f"xid-{self.code}"


def unknown_entry(code: int) -> XidEntry:
    """The entry used for a code the catalog does not know: reported, never quarantined."""
    return XidEntry.model_validate(
        {"code": code, "class": "unknown", "action": "UNKNOWN", "quarantine": False, "recovery": "none"}
    )


class XidCatalog:
    """An immutable code → entry map with the unknown-code fallback."""

    def __init__(self, entries: Mapping[int, XidEntry]) -> None:
        self._entries = dict(entries)

    def lookup(self, code: int) -> XidEntry:
        """The entry for `code`, or an `unknown` entry (never quarantines) when the catalog lacks it."""
        entry = self._entries.get(code)
        return entry if entry is not None else unknown_entry(code)

    def __contains__(self, code: object) -> bool:
        return code in self._entries

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.code))

    def __len__(self) -> int:
        return len(self._entries)

    def merged(self, overrides: Mapping[int, Mapping[str, Any] | BaseModel]) -> XidCatalog:
        """A new catalog with per-field overrides applied; every bad override is reported at once."""
        entries = dict(self._entries)
        problems: list[tuple[str, str]] = []
        for code, override in overrides.items():
            fields = _override_fields(override)
            base = entries.get(code)
            raw: dict[str, Any] = (
                base.model_dump(by_alias=True)
                if base is not None
                else {"action": "OVERRIDE", "recovery": "reset"}
            )
            raw.update(fields)
            raw["code"] = code
            try:
                entries[code] = XidEntry.model_validate(raw)
            except ValidationError as exc:
                for err in exc.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    problems.append((f"health.xid_overrides.{code}.{loc}", err["msg"]))
        if problems:
            raise ConfigError(problems)
        return XidCatalog(entries)


def _override_fields(override: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    if isinstance(override, BaseModel):
        return override.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
    fields = dict(override)
    if "xid_class" in fields:  # accept the Python name as well as the YAML one
        fields["class"] = fields.pop("xid_class")
    return fields


def parse_catalog(text: str, source: str = "xid_catalog.yaml") -> XidCatalog:
    """Parse catalog YAML (`xids: {code: {class, action, quarantine, ...}}`); all problems at once."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("xids"), dict):
        raise ConfigError([(source, "expected a mapping with a top-level `xids:` mapping")])
    entries: dict[int, XidEntry] = {}
    problems: list[tuple[str, str]] = []
    for code, body in doc["xids"].items():
        if not isinstance(code, int) or not isinstance(body, dict):
            problems.append((f"{source}: xids.{code}", "expected `<int>: {class: ..., action: ...}`"))
            continue
        try:
            entries[code] = XidEntry.model_validate({**body, "code": code})
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                problems.append((f"{source}: xids.{code}.{loc}", err["msg"]))
    if problems:
        raise ConfigError(problems)
    return XidCatalog(entries)


@cache
def default_catalog() -> XidCatalog:
    """The catalog shipped in `controller/data/xid_catalog.yaml`, parsed once per process."""
    text = resources.files("controller").joinpath("data/xid_catalog.yaml").read_text(encoding="utf-8")
    return parse_catalog(text)


def load_catalog(overrides: Mapping[int, Mapping[str, Any] | BaseModel] | None = None) -> XidCatalog:
    """The shipped catalog with config overrides applied (see `XidCatalog.merged`)."""
    base = default_catalog()
    return base.merged(overrides) if overrides else base
