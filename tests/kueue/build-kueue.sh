#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue, the version tests/kueue/go.mod pins) into
# .cache/kueue/<version>_<go>/bin/kueue, for the NVLink-domain e2e (Kueue Topology Aware Scheduling with a
# clique level; ../shared/reference/autoscalers-and-domains.md §B.4). Only the Go module proxy is contacted;
# go.mod/go.sum are committed and not rewritten (-mod=readonly). Skipped when go.mod, go.sum and the Go
# version are unchanged. Like `make keda`: run it under the shared heavy lock on a shared machine.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" { print $3; exit }
               $1 == "sigs.k8s.io/kueue" && $2 ~ /^v/ { print $2; exit }' "$HERE/go.mod")
OUT="${KUEUE_CACHE:-$ROOT/.cache/kueue}/${VERSION}_$(go env GOVERSION)"
STAMP="$OUT/stamp"

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="${KUEUE_GOFLAGS:--mod=readonly} -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOPROXY="${GOPROXY%,direct}"

want=$({ cat "$HERE/go.mod" "$HERE/go.sum"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)
mkdir -p "$OUT/bin"
if [[ -x "$OUT/bin/kueue" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "==> Kueue $VERSION: up to date ($OUT/bin)"
  exit 0
fi
echo "==> building Kueue $VERSION manager with $(go env GOVERSION)"
t0=$(date +%s)
cd "$HERE"
go build -p "$(nproc)" -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$VERSION" \
  -o "$OUT/bin/kueue" sigs.k8s.io/kueue/cmd/kueue
echo "$want" > "$STAMP"
ln -sfn "$(basename "$OUT")" "$(dirname "$OUT")/current"
echo "    built in $(( $(date +%s) - t0 ))s: $OUT/bin"
