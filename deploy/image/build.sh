#!/usr/bin/env bash
# Builds the gpuwarden image from deploy/Dockerfile without a registry or a daemon (`make image`):
#
#   [1/5] check that deploy/image/*.txt still agree with requirements.lock (deploy/image/lock.py --check)
#   [2/5] the base: a Debian bookworm root file system made from Debian packages (mmdebstrap: python3 3.11,
#         ca-certificates, nothing else), imported into buildah's storage as localhost/gpuwarden-base:<key>
#   [3/5] the wheelhouse: the runtime wheels (and the build stage's pip/setuptools/wheel) downloaded on the
#         host with --require-hashes (pip inside the build chroot cannot verify TLS here), copied to
#         build/wheelhouse where the Dockerfile's COPY finds it
#   [4/5] buildah bud of deploy/Dockerfile (vfs storage, chroot isolation: works as root with no daemon and
#         no user namespaces), pushed as an OCI archive to .cache/image/<content-key>/gpuwarden.oci.tar
#   [5/5] size and digest printed and written to .cache/image/<content-key>/image.json
#
# The content key is a hash of the Dockerfile, requirements.lock, pyproject.toml, the image's requirement
# files, the base's key and every product source file (gpuwarden/, adapter/, controller/, nodeagent/): an
# unchanged tree rebuilds nothing. `build.sh --archive` prints the archive path for the current tree (exit 1
# when it is not built); `build.sh --key` prints the key; `build.sh --wheelhouse` only fills build/wheelhouse
# (for `docker build -f deploy/Dockerfile .`).
#
# Environment knobs: IMAGE_CACHE (default <repo>/.cache/image), IMAGE_REF (default
# ghcr.io/gpuwarden/gpuwarden:<version>, the name the chart and kustomize base use), IMAGE_FORCE=1.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
CACHE="${IMAGE_CACHE:-$ROOT/.cache/image}"
VERSION=$(awk -F'"' '/^version = / { print $2; exit }' pyproject.toml)
IMAGE_REF="${IMAGE_REF:-ghcr.io/gpuwarden/gpuwarden:$VERSION}"
PY="${PY:-$ROOT/.venv/bin/python}"
SUITE=bookworm
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# essential = dpkg's Essential:yes set (no apt); libstdc++6 for grpcio's C++ core (the node agent's kubelet
# APIs); documentation, man pages and translations are left out.
BASE_ARGS=(
  --variant=essential --include=python3,ca-certificates,libstdc++6
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
)
PRODUCT_DIRS=(gpuwarden adapter controller nodeagent)

die() { echo "image: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

base_key() { { printf '%s\n' "$SUITE" "${MIRRORS[@]}" "${BASE_ARGS[@]}"; } | sha256sum | cut -c1-16; }
content_key() {
  {
    base_key
    sha256sum deploy/Dockerfile .dockerignore requirements.lock pyproject.toml README.md \
      deploy/image/requirements.txt deploy/image/build-requirements.txt
    find "${PRODUCT_DIRS[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z \
      | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

wheelhouse() { # [3/5]: hash-checked wheels into build/wheelhouse (cached by the requirement files' hash)
  local wkey wheels t0 reqs v platform
  wkey=$(cat deploy/image/requirements.txt deploy/image/build-requirements.txt | sha256sum | cut -c1-16)
  wheels="$CACHE/wheels/$wkey"
  if [[ -f "$wheels/.complete" ]]; then
    echo "==> [3/5] wheelhouse: cached ($(ls "$wheels"/*.whl | wc -l) wheels, $wheels)"
  else
    echo "==> [3/5] wheelhouse: downloading hash-pinned wheels on the host"
    t0=$(now)
    rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
    platform=(--only-binary=:all: --python-version=3.11 --implementation=cp --abi=cp311)
    platform+=(--platform=manylinux2014_x86_64)
    for v in 36 34 28 27 24 17 12 5; do platform+=("--platform=manylinux_2_${v}_x86_64"); done
    for reqs in deploy/image/requirements.txt deploy/image/build-requirements.txt; do
      "$PY" -m pip download -q --no-deps --require-hashes "${platform[@]}" -d "$wheels.tmp" -r "$reqs"
    done
    touch "$wheels.tmp/.complete"
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
    echo "    $(ls "$wheels"/*.whl | wc -l) wheels in $(elapsed "$t0")"
  fi
  rm -rf build/wheelhouse && mkdir -p build/wheelhouse && cp "$wheels"/*.whl build/wheelhouse/
}

KEY=$(content_key)
OUT="$CACHE/$KEY"
ARCHIVE="$OUT/gpuwarden.oci.tar"
case "${1:-}" in
  --key) echo "$KEY"; exit 0 ;;
  --archive) [[ -f "$ARCHIVE" && -f "$OUT/image.json" ]] || { echo "image not built for this tree (make image)" >&2; exit 1; }
             echo "$ARCHIVE"; exit 0 ;;
  --wheelhouse) wheelhouse; exit 0 ;;
  "") ;;
  *) die "unknown argument $1 (--key, --archive, --wheelhouse)" ;;
esac

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "$tool not found (make image-tools: apt-get install buildah mmdebstrap)"
done
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)

summary() { # size and digest of the archive, from its own index and manifest
  "$PY" - "$ARCHIVE" "$IMAGE_REF" "$OUT/image.json" "$@" <<'EOF'
import json, sys, tarfile
archive, ref, out, *rest = sys.argv[1:]
with tarfile.open(archive) as tar:
    def blob(digest):
        return json.load(tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1]))
    index = json.load(tar.extractfile("index.json"))
    desc = index["manifests"][0]
    manifest = blob(desc["digest"])
    config = blob(manifest["config"]["digest"])
layers = sum(l["size"] for l in manifest["layers"])
info = {"ref": ref, "digest": desc["digest"], "archive": archive, "layers_bytes": layers,
        "layers": len(manifest["layers"]), "user": config["config"].get("User", ""),
        "archive_bytes": __import__("os").path.getsize(archive)}
if rest:
    info["build_seconds"] = float(rest[0])
    info["unpacked_bytes"] = int(rest[1])
else:
    info.update({k: v for k, v in json.load(open(out)).items() if k not in info})
json.dump(info, open(out, "w"), indent=2)
unpacked = info.get("unpacked_bytes", 0) / 1048576
print(f"    image {ref}\n    digest {info['digest']}\n    size {unpacked:.1f} MiB unpacked, "
      f"{layers / 1048576:.1f} MiB compressed layers ({info['layers']}), user {info['user']}\n"
      f"    archive {archive}")
EOF
}

T_ALL=$(now)
echo "==> image $IMAGE_REF, content key $KEY"
if [[ "${IMAGE_FORCE:-0}" != 1 && -f "$ARCHIVE" && -f "$OUT/image.json" ]]; then
  echo "==> up to date (nothing changed since the last build)"
  summary
  exit 0
fi

# ---- [1/5] ---------------------------------------------------------------------------------------------------
echo "==> [1/5] checking deploy/image/requirements.txt against requirements.lock"
"$PY" deploy/image/lock.py --check | sed 's/^/    /'

# ---- [2/5] ---------------------------------------------------------------------------------------------------
BKEY=$(base_key)
BASE_TAR="$CACHE/base/$SUITE-$BKEY.tar"
BASE_REF="localhost/gpuwarden-base:$SUITE-$BKEY"
mkdir -p "$CACHE/base"
if [[ -f "$BASE_TAR" ]]; then
  echo "==> [2/5] base $BASE_REF: cached ($BASE_TAR)"
else
  echo "==> [2/5] base: mmdebstrap $SUITE (python3, ca-certificates, libstdc++6; ~1 min cold)"
  t0=$(now)
  mmdebstrap --quiet --format=tar "${BASE_ARGS[@]}" "$SUITE" "$BASE_TAR.tmp" "${MIRRORS[@]}"
  mv "$BASE_TAR.tmp" "$BASE_TAR"
  echo "    base root file system in $(elapsed "$t0"): $(mib "$(stat -c %s "$BASE_TAR")")"
fi
if ! "${BUILDAH[@]}" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
  echo "    importing the base into buildah storage ($CACHE/storage)"
  c=$("${BUILDAH[@]}" from scratch)
  m=$("${BUILDAH[@]}" mount "$c")
  tar -C "$m" -xf "$BASE_TAR"
  "${BUILDAH[@]}" umount "$c" >/dev/null
  "${BUILDAH[@]}" commit -q "$c" "$BASE_REF" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null
fi

# ---- [3/5] ---------------------------------------------------------------------------------------------------
wheelhouse
# ---- [4/5] ---------------------------------------------------------------------------------------------------
echo "==> [4/5] buildah bud -f deploy/Dockerfile (base $BASE_REF; ~2 min cold)"
t0=$(now)
mkdir -p "$OUT"
"${BUILDAH[@]}" bud --isolation chroot --pull-never --build-arg "PYTHON_IMAGE=$BASE_REF" \
  --timestamp 0 -f deploy/Dockerfile -t "$IMAGE_REF" . 2>&1 | while IFS= read -r line; do
    case "$line" in
      *STEP*|*COMMIT*|"Storing signatures"|"-->"*) printf '    [%5.0fs] %s\n' "$(awk -v a="$t0" -v b="$(now)" 'BEGIN{print b-a}')" "$line" ;;
      *) printf '           %s\n' "$line" ;;
    esac
  done
[[ ${PIPESTATUS[0]} == 0 ]] || die "buildah bud failed"
c=$("${BUILDAH[@]}" from --pull-never "$IMAGE_REF")
m=$("${BUILDAH[@]}" mount "$c")
unpacked_bytes=$(du -sb "$m" | cut -f1)
"${BUILDAH[@]}" umount "$c" >/dev/null
"${BUILDAH[@]}" rm "$c" >/dev/null
rm -f "$ARCHIVE.tmp"
"${BUILDAH[@]}" push -q "$IMAGE_REF" "oci-archive:$ARCHIVE.tmp:$IMAGE_REF" >/dev/null
mv "$ARCHIVE.tmp" "$ARCHIVE"
build_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
echo "    built and exported in ${build_s}s"

# ---- [5/5] ---------------------------------------------------------------------------------------------------
echo "==> [5/5] image ready in $(elapsed "$T_ALL") total"
summary "$build_s" "$unpacked_bytes"
