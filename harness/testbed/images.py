"""Container images for the real kubelet node, without a registry.

This machine reaches no image registry, so the two images a real node needs are made here from the project's
own C sources (``tests/testbed/images/``): the **pause** image (every pod sandbox's PID 1) and **gwtool**, the
workload image of the node tests (prints its environment and the files it was given, sleeps, reports SIGTERM
and keeps running for a chosen delay). Each is one static binary (``gcc -static``) on an empty root,
written as an OCI image layout archive and imported into containerd's ``k8s.io`` namespace (the one
the CRI plugin serves) under the fully qualified name the kubelet asks for. Builds are cached by a hash
of the source, the compiler version and the image settings, so a warm start compiles nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.testbed.binaries import repo_root

SOURCE_DIR = repo_root() / "tests" / "testbed" / "images"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


class ImageBuildError(RuntimeError):
    """An image could not be compiled or written."""


@dataclass(frozen=True)
class ImageSpec:
    """One single-binary image: ``source`` (a C file under tests/testbed/images) at ``/<binary>``."""

    name: str
    """Fully qualified reference, as the kubelet normalises it (``docker.io/...``)."""
    source: str
    binary: str
    user: str = ""
    """Image ``User`` (``65535:65535`` for pause, like upstream); empty = root."""

    @property
    def file_stem(self) -> str:
        return self.binary


PAUSE_IMAGE = ImageSpec(
    name="docker.io/harness/testbed-pause:1", source="pause.c", binary="pause", user="65535:65535"
)
TOOL_IMAGE = ImageSpec(name="docker.io/harness/testbed-tool:1", source="gwtool.c", binary="gwtool")
IMAGES: tuple[ImageSpec, ...] = (PAUSE_IMAGE, TOOL_IMAGE)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _compiler_version(cc: str) -> str:
    res = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    return res.stdout.splitlines()[0] if res.returncode == 0 and res.stdout else cc


def compile_static(spec: ImageSpec, out_dir: Path, *, cc: str = "gcc") -> Path:
    """Compile the image's binary (``-Os -static``); reuse the cached one when nothing changed."""
    if shutil.which(cc) is None:
        raise ImageBuildError(
            f"{cc} not found: the test bed images are built from C (apt-get install gcc libc6-dev)"
        )
    src = SOURCE_DIR / spec.source
    flags = ["-Os", "-Wall", "-Wextra", "-Werror", "-static"]
    key = hashlib.sha256(src.read_bytes() + " ".join([_compiler_version(cc), *flags]).encode()).hexdigest()[
        :16
    ]
    out = out_dir / f"{spec.binary}-{key}"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    res = subprocess.run([cc, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ImageBuildError(f"{cc} failed on {src} (rc={res.returncode}): {res.stderr.strip()[-800:]}")
    tmp.rename(out)
    return out


def _layer(binary: Path, name: str) -> bytes:
    """A deterministic tar holding ``/<name>`` (mode 0755, root, mtime 0)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = binary.read_bytes()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o755
        info.mtime = 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def oci_archive(spec: ImageSpec, binary: Path) -> bytes:
    """An OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/...``) as one importable tar."""
    layer_tar = _layer(binary, spec.binary)
    layer_gz = gzip.compress(layer_tar, mtime=0)
    image_config: dict[str, object] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [f"/{spec.binary}"], **({"User": spec.user} if spec.user else {})},
        "rootfs": {"type": "layers", "diff_ids": [_sha256(layer_tar)]},
        "history": [
            {"created_by": f"harness.testbed.images: gcc -static tests/testbed/images/{spec.source}"}
        ],
    }
    config_blob = json.dumps(image_config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": _sha256(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": _sha256(layer_gz), "size": len(layer_gz)}],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": _sha256(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    # containerd's importer names the image after this annotation.
                    "io.containerd.image.name": spec.name,
                    "org.opencontainers.image.ref.name": spec.name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    files: list[tuple[str, bytes]] = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    for blob in (layer_gz, config_blob, manifest_blob):
        files.append((f"blobs/sha256/{_sha256(blob).split(':', 1)[1]}", blob))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirname in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(dirname)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build_archives(cache_dir: Path, specs: Sequence[ImageSpec] = IMAGES) -> dict[str, Path]:
    """Image reference -> OCI archive path under ``cache_dir`` (compiled and written when missing)."""
    out: dict[str, Path] = {}
    for spec in specs:
        binary = compile_static(spec, cache_dir / "bin")
        # The archive carries the image reference: key it by that too, or a renamed image (same C source)
        # reuses an archive holding the old name (seen when two worktrees share .cache).
        ref = hashlib.sha256(spec.name.encode()).hexdigest()[:8]
        archive = cache_dir / f"{binary.name}-{ref}.oci.tar"
        if not archive.is_file():
            tmp = archive.with_suffix(".tmp")
            tmp.write_bytes(oci_archive(spec, binary))
            tmp.rename(archive)
        out[spec.name] = archive
    return out
