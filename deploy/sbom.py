"""The image's software bill of materials (CycloneDX 1.5 JSON) from the lock it is built from.

Why from deploy/image/requirements.txt: the image installs exactly that file with `pip --require-hashes
--no-deps` (deploy/Dockerfile), so its names, versions and wheel hashes are the image's Python packages, and
gpuwarden's own wheel on top. The Debian base (python3, ca-certificates, libstdc++6) is listed by its suite.
`python deploy/sbom.py --version X` prints it; `make release` writes it next to the image archive.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "deploy" / "image" / "requirements.txt"
BASE = "debian bookworm (mmdebstrap: python3, ca-certificates, libstdc++6)"
LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9_.-]+)==(?P<version>[^\s]+)(?P<hashes>(?:\s+--hash=sha256:[0-9a-f]{64})*)"
)


def components(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if not match:
            continue
        name, version = match["name"].lower(), match["version"]
        hashes = re.findall(r"sha256:([0-9a-f]{64})", match["hashes"])
        purl = f"pkg:pypi/{name}@{version}"
        digests = [{"alg": "SHA-256", "content": h} for h in hashes]
        found.append({"type": "library", "name": name, "version": version, "purl": purl, "hashes": digests})
    return found


def sbom(version: str, requirements: str) -> dict[str, Any]:
    image = {
        "type": "container",
        "name": "gpuwarden",
        "version": version,
        "purl": f"pkg:oci/gpuwarden@{version}",
    }
    wheel = {
        "type": "application",
        "name": "gpuwarden",
        "version": version,
        "purl": f"pkg:pypi/gpuwarden@{version}",
    }
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {"component": image, "properties": [{"name": "base", "value": BASE}]},
        "components": [wheel, *components(requirements)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--version", required=True)
    args = parser.parse_args(argv)
    json.dump(sbom(args.version, REQUIREMENTS.read_text()), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
