#!/usr/bin/env bash
# Builds Karpenter's kwok cloud provider (sigs.k8s.io/karpenter/kwok, the version tests/karpenter/go.mod pins)
# into .cache/karpenter/<version>_<go>/, for tests/e2e/test_karpenter_*.py: the binary as karpenter-kwok (the
# package's own name, kwok, would clash with the kwok node simulator) and Karpenter's CRDs copied from the
# module (pkg/apis/crds and kwok/apis/crds). Only the Go module proxy is contacted; go.mod/go.sum are committed
# and not rewritten (-mod=readonly). Karpenter v1.15 asks for Go 1.26.9: GOTOOLCHAIN=auto lets the go command
# take that toolchain from the module proxy when the local one is older (CI exports GOTOOLCHAIN=local, which
# would refuse). Skipped when go.mod, go.sum, this script and the Go version are unchanged.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$HERE"
export GOTOOLCHAIN=auto
export CGO_ENABLED=0
export GOFLAGS="${KARPENTER_GOFLAGS:--mod=readonly} -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"

MODULE=sigs.k8s.io/karpenter
VERSION=$(awk -v m="$MODULE" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' go.mod)
GOVERSION=$(go env GOVERSION)
OUT="${KARPENTER_CACHE:-$ROOT/.cache/karpenter}/${VERSION}_${GOVERSION}"
STAMP="$OUT/stamp"

want=$({ cat go.mod go.sum "$HERE/build.sh"; echo "$GOVERSION"; } | sha256sum | cut -d' ' -f1)
if [[ -x "$OUT/bin/karpenter-kwok" && -d "$OUT/crds" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> Karpenter $VERSION (kwok provider): up to date ($OUT)"
  ln -sfn "$(basename "$OUT")" "$(dirname "$OUT")/current"
  exit 0
fi
echo "==> building Karpenter $VERSION (kwok provider) with $GOVERSION"
t0=$(date +%s)
mkdir -p "$OUT/bin" "$OUT/crds"
go build -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$OUT/bin/karpenter-kwok" "$MODULE/kwok"
src=$(go list -m -f '{{.Dir}}' "$MODULE")
rm -f "$OUT"/crds/*.yaml
# The module's kwok/charts/crds KWOKNodeClass file is a git symlink the module zip lacks: take kwok/apis/crds.
cp "$src"/pkg/apis/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$OUT/crds/"
chmod u+w "$OUT"/crds/*.yaml
echo "$want" > "$STAMP"
ln -sfn "$(basename "$OUT")" "$(dirname "$OUT")/current"
echo "    built in $(( $(date +%s) - t0 ))s: $OUT"
