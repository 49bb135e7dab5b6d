#!/usr/bin/env bash
# Builds the KEDA operator and metrics server (github.com/kedacore/keda/v2/cmd/{operator,adapter}, the
# version tests/keda/go.mod pins) into .cache/keda/<version>_<go>/bin, for tests/e2e/test_keda_e2e.py. Only the
# Go module proxy is contacted; go.mod/go.sum are committed and not rewritten (-mod=readonly). Skipped when
# go.mod, go.sum, workspace.sh and the Go version are unchanged. Compiled from the copy of KEDA's module that
# workspace.sh prepares, as build.sh's client is, so the two share every compiled package but pkg/scalers.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=$(awk '$1 == "github.com/kedacore/keda/v2" && $2 ~ /^v/ { print $2; exit }' "$HERE/go.mod")
OUT="${KEDA_CACHE:-$ROOT/.cache/keda}/${VERSION}_$(go env GOVERSION)"
STAMP="$OUT/stamp"

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="${KEDA_GOFLAGS:--mod=readonly} -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"

want=$({ cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/workspace.sh"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)
mkdir -p "$OUT/bin"
if [[ -x "$OUT/bin/keda-operator" && -x "$OUT/bin/keda-adapter" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> KEDA $VERSION: up to date ($OUT/bin)"
  exit 0
fi
echo "==> building KEDA $VERSION operator and metrics server with $(go env GOVERSION)"
t0=$(date +%s)
# shellcheck source=workspace.sh
source "$HERE/workspace.sh"
keda_workspace "$HERE" "${KEDASRC_CACHE:-$ROOT/.cache/kedasrc}"
cd "$HERE"
go build -p "$(nproc)" -trimpath -ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=$VERSION" \
  -o "$OUT/bin/keda-operator" github.com/kedacore/keda/v2/cmd/operator
go build -p "$(nproc)" -trimpath -ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=$VERSION" \
  -o "$OUT/bin/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter
echo "$want" > "$STAMP"
ln -sfn "$(basename "$OUT")" "$(dirname "$OUT")/current"
echo "    built in $(( $(date +%s) - t0 ))s: $OUT/bin"
