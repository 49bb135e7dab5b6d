"""GPU-set arithmetic: adversarial fit checks, picking the least fragmenting set, alignment labels."""

from __future__ import annotations

import pytest

from controller.gpus.placement import Need, alignment, fits, min_span, pick, place
from controller.gpus.topology import Gpu


def gpus(*spec: str) -> list[Gpu]:
    """ "id:numa:pcie:nvlink" strings ('-' = unknown) -> Gpu list."""
    out = []
    for s in spec:
        gid, numa, pcie, nvl = [*s.split(":"), "-", "-", "-"][:4]
        out.append(
            Gpu(
                gid,
                None if numa == "-" else int(numa),
                None if pcie == "-" else pcie,
                None if nvl == "-" else nvl,
            )
        )
    return out


DGX = gpus(*(f"{i}:{i // 4}:p{i // 2}:nvswitch" for i in range(8)))
PAIRS = gpus(*(f"{i}:{i // 4}:p{i // 2}:l{i // 2}" for i in range(8)))

FITS = [
    ("count-only", PAIRS, 0, Need(8), True),
    ("count-short", PAIRS[:3], 0, Need(4), False),
    ("unknown-eats-count", PAIRS, 5, Need(4), False),
    ("one-numa-free", PAIRS, 0, Need(4, "numa"), True),
    ("adversary-spoils-both-numa-nodes", PAIRS, 2, Need(4, "numa"), False),
    ("adversary-cannot-spoil-both", PAIRS, 1, Need(4, "numa"), True),
    ("three-free-per-numa-two-unknown", PAIRS[1:4] + PAIRS[5:8], 1, Need(3, "numa"), True),
    ("unknown-attribute-never-aligns", gpus("0", "1", "2"), 0, Need(2, "numa"), False),
    ("single-gpu-needs-no-alignment", gpus("0"), 0, Need(1, "numa"), True),
    ("span-two-numa-nodes", PAIRS, 0, Need(8, "numa", 2), True),
    ("span-with-unknown", PAIRS, 1, Need(8, "numa", 2), False),
    ("span-too-few-groups", PAIRS[:3] + PAIRS[4:7], 0, Need(6, "numa", 1), False),
]


@pytest.mark.parametrize(("free", "unknown", "need", "ok"), [c[1:] for c in FITS], ids=[c[0] for c in FITS])
def test_fits(free: list[Gpu], unknown: int, need: Need, ok: bool) -> None:
    assert fits(free, unknown, need) is ok


PLACES = [
    ("lone-gpu-first", gpus("0:0:a:x", "2:0:b:y", "3:0:b:y"), Need(1), ("0",)),
    ("pair-kept-whole", [g for g in PAIRS if g.id not in "0"], Need(2, "numa"), ("2", "3")),
    ("tightest-numa-node", [g for g in PAIRS if g.id not in "014"], Need(2, "numa"), ("2", "3")),
    ("nvswitch-still-numa-aligned", DGX, Need(4, "numa"), ("0", "1", "2", "3")),
    ("nvswitch-unconstrained-prefers-numa", DGX, Need(4), ("0", "1", "2", "3")),
    (
        "three-in-numa-uses-pair-plus-lone",
        [g for g in PAIRS if g.id not in "0"],
        Need(3, "numa"),
        ("1", "2", "3"),
    ),
    ("spread-largest-numa-first", [g for g in PAIRS if g.id not in "0145"], Need(4), ("2", "3", "6", "7")),
    ("span-fewest-numa-nodes", PAIRS, Need(6, "numa", 2), ("0", "1", "2", "3", "4", "5")),
    ("pcie-constraint", [g for g in PAIRS if g.id not in "0"], Need(2, "pcie"), ("2", "3")),
    ("no-fit", PAIRS[:3], Need(4), None),
]


@pytest.mark.parametrize(("free", "need", "ids"), [c[1:] for c in PLACES], ids=[c[0] for c in PLACES])
def test_place(free: list[Gpu], need: Need, ids: tuple[str, ...] | None) -> None:
    chosen = place(free, 0, need)
    assert (tuple(g.id for g in chosen) if chosen is not None else None) == ids


def test_pick_returns_everything_when_asked_for_all() -> None:
    assert pick(PAIRS, 8) == PAIRS


@pytest.mark.parametrize(
    ("ids", "span", "label"),
    [
        ("0", 1, "single"),
        ("01", 1, "nvlink"),
        ("02", 1, "numa"),
        ("04", 1, "cross-numa"),
        ("01234567", 2, "whole-numa"),
        ("0123456", 1, "cross-numa"),
    ],
)
def test_alignment(ids: str, span: int, label: str) -> None:
    assert alignment([g for g in PAIRS if g.id in ids], span) == label


def test_alignment_pcie_and_unknown() -> None:
    assert alignment(gpus("0:0:p:a", "1:0:p:b")) == "pcie"
    assert alignment(gpus("0", "1")) == "unknown"


@pytest.mark.parametrize(
    ("sizes", "k", "span"), [([4, 4], 4, 1), ([4, 4], 5, 2), ([2, 2, 2, 2], 8, 4), ([1], 2, 0)]
)
def test_min_span(sizes: list[int], k: int, span: int) -> None:
    assert min_span(sizes, k) == span
