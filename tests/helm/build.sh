#!/usr/bin/env bash
# Builds Helm (helm.sh/helm/v3/cmd/helm) at the version pinned in go.mod next to this script into
# .cache/helm/<version>_<go version>/bin/helm, for the chart tests (deploy/helm/gpuwarden; tests/e2e/test_helm_*).
# Only the Go module proxy is contacted; go.mod/go.sum are committed and not rewritten (-mod=readonly). A build
# whose inputs (go.mod, go.sum, Go version, flags) are unchanged is skipped. The ldflags are upstream's Makefile's:
# the version, and the Kubernetes version `helm template` / `helm lint` assume (from the client-go it links).
#
# Environment knobs: HELM_CACHE (default <repo>/.cache/helm), HELM_GO_P (go build -p, default nproc),
# HELM_FORCE=1 (ignore the stamp).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE="${HELM_CACHE:-$ROOT/.cache/helm}"

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"   # module proxy only, never a direct VCS fetch
P="${HELM_GO_P:-$(nproc)}"

die() { echo "helm/build.sh: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
module_version() { awk -v m="$1" '($1 == m || ($1 == "require" && $2 == m)) { print ($1 == m ? $2 : $3); exit }' "$HERE/go.mod"; }

command -v go >/dev/null || die "go not found on PATH (Go 1.26 is needed, GOTOOLCHAIN=local)"
GOV=$(go env GOVERSION)
VERSION=$(module_version helm.sh/helm/v3)
[[ -n "$VERSION" ]] || die "cannot read the helm.sh/helm/v3 version from $HERE/go.mod"
CLIENT_GO=$(module_version k8s.io/client-go)
[[ "$CLIENT_GO" =~ ^v0\.([0-9]+)\. ]] || die "cannot read the k8s.io/client-go version from $HERE/go.mod"
K8S_MINOR=${BASH_REMATCH[1]}

OUT="$CACHE/${VERSION}_${GOV}"
BIN="$OUT/bin/helm"
STAMP="$OUT/stamp"
LOG="$OUT/build.log"
mkdir -p "$OUT/bin"
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
LDFLAGS+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR"
LDFLAGS+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$K8S_MINOR"
want=$({ cat "$HERE/go.mod" "$HERE/go.sum"; echo "$GOV $CGO_ENABLED $LDFLAGS -trimpath"; } | sha256sum | cut -d' ' -f1)

if [[ "${HELM_FORCE:-0}" != 1 && -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> helm $VERSION ($GOV): up to date ($BIN)"
else
  echo "==> building helm $VERSION with $GOV, -p $P (~3-5 min cold on 2 cores: module downloads plus compile; log: $LOG)"
  t0=$(now)
  rc=0
  (
    cd "$HERE"
    set -x
    go build -p "$P" -trimpath -ldflags "$LDFLAGS" -o "$BIN" helm.sh/helm/v3/cmd/helm
  ) >"$LOG" 2>&1 || rc=$?
  if (( rc != 0 )); then
    echo "helm/build.sh: build FAILED (rc=$rc); last lines of $LOG:" >&2
    tail -30 "$LOG" >&2
    exit "$rc"
  fi
  echo "$want" > "$STAMP"
  echo "    built in $(elapsed "$t0"): $BIN ($(du -h "$BIN" | cut -f1))"
fi
got=$("$BIN" version --template '{{.Version}}')
[[ "$got" == "$VERSION" ]] || die "$BIN version says $got, expected $VERSION"
ln -sfn "${VERSION}_${GOV}" "$CACHE/current"
echo "    $CACHE/current/bin/helm ($got)"
