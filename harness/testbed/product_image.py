"""The gpuwarden image built by ``make image``, read from its OCI archive without any container tool.

The image tests inspect what the image holds and run commands in its root file system; the test bed imports
it into the real node's containerd. Both start from the archive ``deploy/image/build.sh`` wrote for the
current tree (found by asking the script, so the content key is computed in one place). Reading is plain
``tarfile``: the archive's ``index.json`` names the manifest, the manifest the config and the layers, and
the layers are applied in order with the OCI whiteout rules (``.wh.<name>`` deletes a path of a lower layer,
``.wh..wh..opq`` empties a directory).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.testbed.binaries import repo_root

BUILD_SCRIPT = repo_root() / "deploy" / "image" / "build.sh"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class ProductImageError(RuntimeError):
    """The image is not built for this tree, or its archive cannot be read."""


def archive_path() -> Path:
    """The OCI archive ``make image`` built for the current sources (raises if it is not built)."""
    res = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--archive"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise ProductImageError(f"{res.stderr.strip() or res.stdout.strip()} (run `make image`)")
    return Path(res.stdout.strip())


def _norm(name: str) -> str:
    return posixpath.normpath(name.lstrip("/")).removeprefix("./")


@dataclass(frozen=True)
class ProductImage:
    """One image in an OCI archive (``oci-archive:`` as written by buildah push)."""

    archive: Path
    ref: str
    digest: str
    """The manifest's digest (what a registry would call the image's digest)."""
    config_digest: str
    """The config blob's digest: containerd's image ID, the kubelet's ``imageID``."""
    config: dict[str, Any]
    layers: tuple[str, ...]
    """Layer blob names (``blobs/sha256/<hex>``) from the bottom up."""

    @classmethod
    def load(cls, archive: Path | None = None) -> ProductImage:
        path = archive or archive_path()
        with tarfile.open(path) as tar:

            def blob(digest: str) -> dict[str, Any]:
                f = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
                if f is None:
                    raise ProductImageError(f"{path}: blob {digest} missing")
                doc: dict[str, Any] = json.load(f)
                return doc

            index_file = tar.extractfile("index.json")
            if index_file is None:
                raise ProductImageError(f"{path}: no index.json (not an OCI archive)")
            desc = json.load(index_file)["manifests"][0]
            manifest = blob(desc["digest"])
            config = blob(manifest["config"]["digest"])
        ref = (desc.get("annotations") or {}).get("org.opencontainers.image.ref.name", "")
        layers = tuple("blobs/sha256/" + layer["digest"].split(":", 1)[1] for layer in manifest["layers"])
        return cls(
            archive=path,
            ref=ref,
            digest=desc["digest"],
            config_digest=manifest["config"]["digest"],
            config=config,
            layers=layers,
        )

    @property
    def user(self) -> str:
        return str((self.config.get("config") or {}).get("User", ""))

    @property
    def entrypoint(self) -> list[str]:
        return list((self.config.get("config") or {}).get("Entrypoint") or [])

    @property
    def env(self) -> dict[str, str]:
        pairs = (self.config.get("config") or {}).get("Env") or []
        return dict(str(p).split("=", 1) for p in pairs)

    def _layers(self) -> Iterator[tarfile.TarFile]:
        """Each layer, bottom up, open for one sequential pass."""
        with tarfile.open(self.archive) as outer:
            for name in self.layers:
                f = outer.extractfile(name)
                if f is None:
                    raise ProductImageError(f"{self.archive}: layer {name} missing")
                with tarfile.open(fileobj=f, mode="r:*") as layer:
                    yield layer

    def files(self) -> dict[str, str]:
        """Every path of the flattened image -> its type (``f`` file, ``d`` dir, ``l`` link, ``o`` other)."""
        merged: dict[str, str] = {}
        for layer in self._layers():
            for member in layer:
                path = _norm(member.name)
                parent, base = posixpath.split(path)
                if base == OPAQUE:
                    prefix = parent + "/"
                    for p in [p for p in merged if p.startswith(prefix)]:
                        del merged[p]
                    continue
                if base.startswith(WHITEOUT):
                    gone = posixpath.join(parent, base[len(WHITEOUT) :])
                    for p in [p for p in merged if p == gone or p.startswith(gone + "/")]:
                        del merged[p]
                    continue
                kind = "d" if member.isdir() else "f" if member.isfile() else "l" if member.issym() else "o"
                merged[path] = kind
        return merged

    def unpack(self, target: Path) -> Path:
        """Apply the layers into ``target`` (as root: owners, modes and device nodes kept)."""
        target.mkdir(parents=True, exist_ok=True)
        for layer in self._layers():
            for member in layer:
                path = _norm(member.name)
                parent, base = posixpath.split(path)
                if base == OPAQUE:
                    d = target / parent
                    for child in d.iterdir() if d.is_dir() else []:
                        _remove(child)
                    continue
                if base.startswith(WHITEOUT):
                    _remove(target / parent / base[len(WHITEOUT) :])
                    continue
                dest = target / path
                if dest.is_symlink() or (dest.exists() and not (dest.is_dir() and member.isdir())):
                    _remove(dest)
                layer.extract(member, target, numeric_owner=True, filter="fully_trusted")
        return target


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def run_in_rootfs(
    rootfs: Path,
    image: ProductImage,
    args: list[str],
    *,
    entrypoint: bool = True,
    user: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``entrypoint + args`` (``args`` alone without ``entrypoint``) chrooted into ``rootfs`` as the
    image's user with the image's environment."""
    uid_gid = user or image.user or "0:0"
    if ":" not in uid_gid:
        uid_gid = f"{uid_gid}:{uid_gid}"
    env = {"HOME": "/", **image.env}
    cmd = [
        "chroot",
        f"--userspec={uid_gid}",
        str(rootfs),
        *_resolve(rootfs, env, image.entrypoint if entrypoint else args[:1]),
        *(args if entrypoint else args[1:]),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False, cwd="/")


def _resolve(rootfs: Path, env: dict[str, str], argv: list[str]) -> list[str]:
    """The entrypoint's first word looked up on the image's PATH inside the root file system."""
    if not argv or "/" in argv[0]:
        return argv
    for d in env.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        if (rootfs / d.lstrip("/") / argv[0]).exists():
            return [posixpath.join(d, argv[0]), *argv[1:]]
    raise ProductImageError(f"{argv[0]} not found on the image's PATH {env.get('PATH')}")
