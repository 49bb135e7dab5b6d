#!/usr/bin/env bash
# Builds prometheus-adapter (sigs.k8s.io/prometheus-adapter/cmd/adapter) at the version pinned in go.mod next to
# this script into .cache/upstream/<version>_<go version>/bin/adapter, for the side-by-side benchmark
# (tests/bench/bench_adapter_upstream.py). Only the Go module proxy is contacted; go.mod/go.sum are committed and
# not rewritten (-mod=readonly). A build whose inputs (go.mod, go.sum, Go version, flags) are unchanged is skipped.
#
# Environment knobs: UPSTREAM_CACHE (default <repo>/.cache/upstream), UPSTREAM_GO_P (go build -p, default nproc),
# UPSTREAM_FORCE=1 (ignore the stamp).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
CACHE="${UPSTREAM_CACHE:-$ROOT/.cache/upstream}"

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"   # module proxy only, never a direct VCS fetch
P="${UPSTREAM_GO_P:-$(nproc)}"

die() { echo "upstream/build.sh: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

command -v go >/dev/null || die "go not found on PATH"
GOV=$(go env GOVERSION)
VERSION=$(awk '$1 == "require" && $2 == "sigs.k8s.io/prometheus-adapter" { print $3 }' "$HERE/go.mod")
[[ -n "$VERSION" ]] || die "cannot read the prometheus-adapter version from $HERE/go.mod"

OUT="$CACHE/${VERSION}_${GOV}"
BIN="$OUT/bin/adapter"
STAMP="$OUT/stamp"
LOG="$OUT/build.log"
mkdir -p "$OUT/bin"
LDFLAGS="-s -w"
want=$({ cat "$HERE/go.mod" "$HERE/go.sum"; echo "$GOV $CGO_ENABLED $LDFLAGS -trimpath"; } | sha256sum | cut -d' ' -f1)

if [[ "${UPSTREAM_FORCE:-0}" != 1 && -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> prometheus-adapter $VERSION ($GOV): up to date ($BIN)"
else
  echo "==> building prometheus-adapter $VERSION with $GOV, -p $P (~3-4.5 min cold on 2 cores: module downloads plus compile; log: $LOG)"
  t0=$(now)
  rc=0
  (
    cd "$HERE"
    set -x
    go build -p "$P" -trimpath -ldflags "$LDFLAGS" -o "$BIN" sigs.k8s.io/prometheus-adapter/cmd/adapter
  ) >"$LOG" 2>&1 || rc=$?
  if (( rc != 0 )); then
    echo "upstream/build.sh: build FAILED (rc=$rc); last lines of $LOG:" >&2
    tail -30 "$LOG" >&2
    exit "$rc"
  fi
  echo "$want" > "$STAMP"
  echo "    built in $(elapsed "$t0"): $BIN ($(du -h "$BIN" | cut -f1))"
fi
# pflag exits 2 on --help; check that the usage text is the adapter's.
usage=$("$BIN" --help 2>&1 || true)
[[ "$usage" == *--prometheus-url* ]] || die "$BIN --help does not list --prometheus-url"
ln -sfn "${VERSION}_${GOV}" "$CACHE/current"
echo "    $CACHE/current/bin/adapter"
