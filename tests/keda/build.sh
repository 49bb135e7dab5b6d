#!/usr/bin/env bash
# Builds kedaclient (main.go: KEDA's own external-scaler client, github.com/kedacore/keda/v2/pkg/scalers at
# the version pinned in go.mod) into .cache/kedaclient/kedaclient, for tests/integration/test_keda_scaler.py.
# Only the Go module proxy is contacted; go.mod/go.sum are committed and not rewritten (-mod=readonly).
# Skipped when go.mod, go.sum, main.go and the Go version are unchanged (the stamp is their content hash).
# pkg/scalers compiles every KEDA scaler and its cloud SDKs: measured cold on 2 cores in the closing note
# of issue 28 (see docs/keda.md, "Testing").
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT="${KEDACLIENT_CACHE:-$ROOT/.cache/kedaclient}"
BIN="$OUT/kedaclient"
STAMP="$OUT/stamp"

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"

command -v go >/dev/null || { echo "keda/build.sh: go not found on PATH" >&2; exit 1; }
want=$({ cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/main.go"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)
mkdir -p "$OUT"
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> kedaclient: up to date ($BIN)"
  exit 0
fi
echo "==> building kedaclient (KEDA $(awk '$1 == "github.com/kedacore/keda/v2" && $2 ~ /^v/ { print $2; exit }' "$HERE/go.mod")'s external-scaler client) with $(go env GOVERSION)"
t0=$(date +%s)
(cd "$HERE" && go build -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$BIN.tmp" . && mv "$BIN.tmp" "$BIN")
echo "$want" > "$STAMP"
echo "    built in $(( $(date +%s) - t0 ))s: $BIN"
