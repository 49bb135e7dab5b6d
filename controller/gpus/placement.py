"""GPU-set arithmetic: group GPUs by NUMA node / PCIe switch / NVLink domain, test and pick sets.

Why it exists: "is there a set of k free GPUs sharing a NUMA node, whatever GPUs the pods we cannot see are
holding?" and "which k GPUs fragment the node least?" are the two questions every verb asks, and they are
subtle enough to deserve their own table tests. `decide.py` adds policies, reasons and scores on top.

Conventions: GPU lists are id-sorted; a GPU whose attribute at a level is unknown (None) forms a group of its
own, so unknown topology never satisfies an alignment requirement for more than one GPU. A `Need` says which
attribute the set must share (`level`) and across how many groups it may spread (`span`, 1 unless a pod
asks for more GPUs than any NUMA node in the fleet holds). Pure functions only: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controller.gpus.topology import Gpu
from gpuwarden.wellknown import gpu_id_key as gpu_sort_key

LOCALITY_LEVELS = ("nvlink", "pcie", "numa")
"""Locality levels, best first: NVLink peers beat a shared PCIe switch, which beats a shared NUMA node."""


@dataclass(frozen=True, slots=True)
class Need:
    """k GPUs that must share `level` (None: anything goes) over at most `span` groups of that level."""

    k: int
    level: str | None = None
    span: int = 1


def group_key(gpu: Gpu, level: str) -> tuple[int, object]:
    value = getattr(gpu, level)
    return (0, value) if value is not None else (1, gpu.id)


def groups(gpus: Iterable[Gpu], level: str) -> list[list[Gpu]]:
    """GPUs grouped by an attribute, in first-seen order; unknown attribute = a group of one."""
    out: dict[tuple[int, object], list[Gpu]] = {}
    for gpu in gpus:
        out.setdefault(group_key(gpu, level), []).append(gpu)
    return list(out.values())


def known_groups(gpus: Iterable[Gpu], level: str) -> list[list[Gpu]]:
    """Only the groups whose attribute is known."""
    return [g for g in groups(gpus, level) if getattr(g[0], level) is not None]


def group_sizes(gpus: Iterable[Gpu], level: str) -> list[int]:
    """How many GPUs each known group at `level` holds (the cheap form of `known_groups`)."""
    sizes = Counter(getattr(g, level) for g in gpus)
    sizes.pop(None, None)
    return list(sizes.values())


def tightest(candidates: Iterable[list[Gpu]], k: int) -> list[Gpu] | None:
    """The group with the fewest GPUs that still holds k (lowest first id on ties)."""
    fitting = [g for g in candidates if len(g) >= k]
    return min(fitting, key=lambda g: (len(g), gpu_sort_key(g[0].id))) if fitting else None


def min_span(sizes: Iterable[int], k: int) -> int:
    """The fewest groups (of the given sizes) that together hold k; 0 when even all of them cannot."""
    total = 0
    for count, size in enumerate(sorted(sizes, reverse=True), start=1):
        total += size
        if total >= k:
            return count
    return 0


def fits(free: list[Gpu], unknown: int, need: Need) -> bool:
    """Whether `need` is satisfiable among `free` for *any* placement of `unknown` further busy GPUs.

    Single group: an adversary must spend `size - k + 1` GPUs to spoil each group holding k, so a set is
    guaranteed iff those costs add up to more than `unknown`. Spread over `span` groups: the `span`
    largest groups minus `unknown` must still hold k.
    """
    k = need.k
    if len(free) - unknown < k:
        return False
    if need.level is None or k <= 1:
        return True
    sizes = group_sizes(free, need.level)
    if need.span <= 1:
        return sum(size - k + 1 for size in sizes if size >= k) > unknown
    return sum(sorted(sizes, reverse=True)[: need.span]) - unknown >= k


def pick(gpus: list[Gpu], k: int, levels: Sequence[str] = LOCALITY_LEVELS) -> list[Gpu]:
    """k of `gpus`: inside the tightest group at the best locality level that can hold them (ties go to the
    group whose coarser groups are tightest, so a lone GPU is used before a pair is split), else spread over
    the fewest groups of the coarsest level, largest first, topped up from the tightest group that fits."""
    if k >= len(gpus):
        return gpus[:k]
    for i, level in enumerate(levels):
        fitting = [
            g for g in groups(gpus, level) if len(g) >= k and (k == 1 or getattr(g[0], level) is not None)
        ]
        if not fitting:
            continue
        rest = levels[i + 1 :]
        sizes = [Counter(group_key(g, lvl) for g in gpus) for lvl in rest]

        def tightness(
            group: list[Gpu], rest: Sequence[str] = rest, sizes: list[Counter[tuple[int, object]]] = sizes
        ) -> tuple[object, ...]:
            coarser = tuple(size[group_key(group[0], lvl)] for size, lvl in zip(sizes, rest, strict=True))
            return (len(group), *coarser, gpu_sort_key(group[0].id))

        best = min(fitting, key=tightness)
        return best if len(best) == k else pick(best, k, rest)
    pool = groups(gpus, levels[-1]) if levels else [[g] for g in gpus]
    pool.sort(key=lambda g: (-len(g), gpu_sort_key(g[0].id)))
    chosen: list[Gpu] = []
    while len(chosen) < k:
        cover = tightest(pool, k - len(chosen))
        if cover is not None:
            chosen += pick(cover, k - len(chosen), levels[:-1])
            break
        chosen += pool.pop(0)
    return sorted(chosen, key=lambda g: gpu_sort_key(g.id))


def lone(free: list[Gpu]) -> Gpu:
    """The best single GPU: the one in the smallest NVLink group, then PCIe switch, then NUMA node (a GPU
    whose peers are busy is used before one that would break up a free pair); lowest id on ties."""
    nvlink = Counter(g.nvlink for g in free)
    pcie = Counter(g.pcie for g in free)
    numa = Counter(g.numa for g in free)

    def tightness(g: Gpu) -> tuple[int, int, int, tuple[int, int, str]]:
        return (
            nvlink[g.nvlink] if g.nvlink is not None else 1,
            pcie[g.pcie] if g.pcie is not None else 1,
            numa[g.numa] if g.numa is not None else 1,
            gpu_sort_key(g.id),
        )

    return min(free, key=tightness)


def place(free: list[Gpu], unknown: int, need: Need) -> list[Gpu] | None:
    """The set to use for `need`, or None. Without a constraint, one NUMA node is still tried first."""
    if not fits(free, unknown, need):
        return None
    k, level = need.k, need.level
    if k == 1:
        return [lone(free)]
    if level is None:
        if fits(free, 0, Need(k, "numa")):
            level = "numa"
        else:
            return pick(free, k)
    if need.span > 1 and level == need.level:
        chosen = pick(free, k, ("pcie", "numa"))  # no single group holds k: fewest NUMA nodes, largest first
        spread = {getattr(g, level) for g in chosen}
        return chosen if None not in spread and len(spread) <= need.span else None
    best = tightest(known_groups(free, level), k)
    if best is None:
        return None
    return pick(best, k, tuple(lvl for lvl in LOCALITY_LEVELS if lvl not in (level, "numa")))


def alignment(gpus: Sequence[Gpu], numa_span: int = 1) -> str:
    """How local a set is: single (one GPU); nvlink / pcie / numa (one NUMA node, finest level shared);
    whole-numa (over exactly `numa_span` > 1 NUMA nodes, the fewest possible); cross-numa; unknown."""
    if len(gpus) <= 1:
        return "single"

    def shared(level: str) -> bool:
        values = {getattr(g, level) for g in gpus}
        return len(values) == 1 and None not in values

    if shared("numa"):
        return "nvlink" if shared("nvlink") else "pcie" if shared("pcie") else "numa"
    if any(g.numa is None for g in gpus):
        return "unknown"
    spread = len({g.numa for g in gpus})
    return "whole-numa" if 1 < spread <= numa_span else "cross-numa"
