"""What the gpuwarden image must and must not hold, as path rules over its flattened file list.

The image is the product and its runtime dependencies: no test bed, simulator or demo (the harness), no
tests, no installer (pip, setuptools, wheel, any bundled ``*.whl``), no compiler or assembler. Pure: a
file list in, the offending paths out, so the rules themselves are table-tested without an image
(tests/unit/test_image_rules.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

SITE = r"(?:site|dist)-packages"
PRODUCT_PACKAGES = ("gpuwarden", "adapter", "controller", "nodeagent")


@dataclass(frozen=True)
class Rule:
    id: str
    pattern: re.Pattern[str]
    why: str


def _rule(rule_id: str, pattern: str, why: str) -> Rule:
    return Rule(rule_id, re.compile(pattern), why)


FORBIDDEN: tuple[Rule, ...] = (
    _rule("harness", r"(^|/)harness(/|$)", "the test bed, simulator and demo live beside the product"),
    _rule("testbed", r"(^|/)testbed(/|$)", "test bed sources"),
    _rule(
        "product-demo-or-simulator",
        rf"{SITE}/(gpuwarden|adapter|controller|nodeagent)/(.*/)?(simulator|demo|fleet)(/|\.py$)",
        "demo and simulator code inside a product package",
    ),
    _rule("tests", rf"{SITE}/tests(/|$)|(^|/)src/tests(/|$)", "the project's tests"),
    _rule("pip", rf"{SITE}/pip(/|$)|(^|/)bin/pip[0-9.]*$|(^|/)pip-[^/]*\.dist-info(/|$)", "an installer"),
    _rule(
        "setuptools",
        rf"{SITE}/(setuptools|pkg_resources|_distutils_hack)(/|$)|(^|/)setuptools-[^/]*\.dist-info(/|$)",
        "a build tool",
    ),
    _rule("wheel", rf"{SITE}/wheel(/|$)|(^|/)wheel-[^/]*\.dist-info(/|$)|(^|/)bin/wheel$", "a build tool"),
    _rule("bundled-wheels", r"\.whl$|(^|/)python-wheels(/|$)", "wheels that can install pip"),
    _rule(
        "compiler",
        r"(^|/)bin/((x86_64-linux-gnu-)?(cc|c\+\+|gcc|g\+\+|cpp|clang|clang\+\+|tcc)(-[0-9.]+)?|as|ld|ld\.bfd)$"
        r"|(^|/)lib/gcc(/|$)|(^|/)cc1(plus)?$",
        "a compiler, assembler or linker",
    ),
    _rule("build-tree", r"^(src|wheels|dist|lock|opt/buildtools)(/|$)", "the build stage's leftovers"),
)


def offending(paths: Iterable[str]) -> list[tuple[str, str]]:
    """(rule id, path) for every path a forbidden rule matches, in path order."""
    out: list[tuple[str, str]] = []
    for path in sorted(paths):
        for rule in FORBIDDEN:
            if rule.pattern.search(path):
                out.append((rule.id, path))
    return out


def missing_product(paths: Iterable[str], site_packages: str) -> list[str]:
    """The product packages (``<pkg>/__init__.py`` under ``site_packages``) the file list lacks."""
    have = set(paths)
    return [p for p in PRODUCT_PACKAGES if f"{site_packages}/{p}/__init__.py" not in have]
