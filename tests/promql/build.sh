#!/usr/bin/env bash
# Builds promqlcheck (main.go: Prometheus' own PromQL parser, github.com/prometheus/prometheus/promql/parser
# at the version pinned in go.mod) into .cache/promqlcheck/promqlcheck, for the PromQL property tests
# (tests/integration/test_promql_properties.py). Only the Go module proxy is contacted; go.mod/go.sum are
# committed and not rewritten (-mod=readonly). Skipped when go.mod, go.sum, main.go and the Go version are
# unchanged. ~1 min cold on 2 cores (module downloads plus compile).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT="${PROMQLCHECK_CACHE:-$ROOT/.cache/promqlcheck}"
BIN="$OUT/promqlcheck"
STAMP="$OUT/stamp"

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"

command -v go >/dev/null || { echo "promql/build.sh: go not found on PATH" >&2; exit 1; }
want=$({ cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/main.go"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)
mkdir -p "$OUT"
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> promqlcheck: up to date ($BIN)"
  exit 0
fi
echo "==> building promqlcheck (Prometheus' PromQL parser) with $(go env GOVERSION)"
t0=$(date +%s)
(cd "$HERE" && go build -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$BIN" .)
echo "$want" > "$STAMP"
echo "    built in $(( $(date +%s) - t0 ))s: $BIN"
