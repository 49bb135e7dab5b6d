#!/usr/bin/env bash
# Builds kedaclient (main.go: KEDA's own external-scaler client, github.com/kedacore/keda/v2/pkg/scalers at
# the version pinned in go.mod) into .cache/kedaclient/kedaclient, for tests/integration/test_keda_scaler.py
# and tests/bench/bench_keda.py. Only the Go module proxy is contacted; go.mod/go.sum are committed and not
# rewritten (-mod=readonly). Skipped when go.mod, go.sum, main.go, build.sh, workspace.sh and Go are unchanged.
#
# Narrowed build (issue 51): KEDA's pkg/scalers is one Go package holding every scaler, so importing it
# compiles every scaler's cloud and database SDK (409 s cold on 2 cores, 2026-12-07). The client needs four of
# its ~75 files, so it compiles KEDA's own source with the other scaler files left out (`go build -overlay`
# maps them to nothing; nothing of ours is added to KEDA's code), from the copy of the pinned module that
# workspace.sh prepares; build-keda.sh (the operator, e2e) compiles the whole of pkg/scalers from the same copy,
# so KEDA's other packages and every dependency are compiled once for both.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT="${KEDACLIENT_CACHE:-$ROOT/.cache/kedaclient}"
BIN="$OUT/kedaclient"
STAMP="$OUT/stamp"
# scaler.go: the Scaler interface and helpers; external_scaler.go: NewExternalScaler, NewExternalPushScaler;
# prometheus_scaler.go: NewPrometheusScaler (bench_keda's "load" op); azure_queue_scaler.go: declares
# externalMetricType, the constant the other three use (it drags in the azqueue SDK, nothing else).
KEEP=(scaler.go external_scaler.go prometheus_scaler.go azure_queue_scaler.go)

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"

die() { echo "keda/build.sh: error: $*" >&2; exit 1; }
command -v go >/dev/null || die "go not found on PATH"
VERSION=$(awk '$1 == "github.com/kedacore/keda/v2" && $2 ~ /^v/ { print $2; exit }' "$HERE/go.mod")
[[ -n "$VERSION" ]] || die "no github.com/kedacore/keda/v2 require in $HERE/go.mod"
want=$({ cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/main.go" "$HERE/build.sh" "$HERE/workspace.sh"; go env GOVERSION; } \
  | sha256sum | cut -d' ' -f1)
mkdir -p "$OUT"
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> kedaclient: up to date ($BIN)"
  exit 0
fi
echo "==> building kedaclient (KEDA $VERSION's external-scaler client; pkg/scalers narrowed to ${KEEP[*]}) with $(go env GOVERSION)"
t0=$(date +%s)
# shellcheck source=workspace.sh
source "$HERE/workspace.sh"
keda_workspace "$HERE" "${KEDASRC_CACHE:-$ROOT/.cache/kedasrc}"
for f in "${KEEP[@]}"; do [[ -f "$KEDA_SRC/pkg/scalers/$f" ]] || die "KEDA $VERSION has no pkg/scalers/$f (update KEEP)"; done
{
  printf '{"Replace": {'
  sep=""
  for f in "$KEDA_SRC"/pkg/scalers/*.go; do
    [[ " ${KEEP[*]} " == *" $(basename "$f") "* ]] && continue
    printf '%s"%s": ""' "$sep" "$f"
    sep=", "
  done
  printf '}}\n'
} > "$OUT/overlay.json"
(cd "$HERE" && go build -overlay "$OUT/overlay.json" -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$BIN.tmp" . \
  && mv "$BIN.tmp" "$BIN")
echo "$want" > "$STAMP"
echo "    built in $(( $(date +%s) - t0 ))s: $BIN"
