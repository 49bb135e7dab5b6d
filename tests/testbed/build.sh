#!/usr/bin/env bash
# Builds the e2e test bed: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy,
# etcd, kwok and kwokctl, from the Go wrapper modules next to this script, into .cache/testbed/<versions-key>/bin/.
#
# Why a script and not `go install`: k8s.io/kubernetes and go.etcd.io/etcd/server/v3 have replace directives in
# their go.mod, so `go install pkg@version` refuses them; the wrapper modules (k8s/, etcd/, kwok/) pin the
# versions, carry the replace block and commit go.sum, so a build is reproducible and only talks to the Go
# module proxy. Components already built for the same inputs (stamp files) are skipped.
#
# Environment knobs: TESTBED_CACHE (default <repo>/.cache/testbed), TESTBED_GO_P (go build -p, default nproc),
# TESTBED_FORCE=1 (ignore stamps), TESTBED_KUBE=oldest (build the oldest supported Kubernetes from the wrapper
# modules in oldest/ instead of k8s/ and kube-proxy/, and point .cache/testbed/oldest instead of current at it;
# `make test-oldest`).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TB="$ROOT/tests/testbed"
CACHE="${TESTBED_CACHE:-$ROOT/.cache/testbed}"

export GOTOOLCHAIN=local          # never download a toolchain
export CGO_ENABLED=0              # static binaries like upstream's, no cgo link step
export GOFLAGS="-mod=readonly -buildvcs=false"   # go.mod/go.sum are committed; do not rewrite them
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"  # module proxy only, no direct VCS fetches
P="${TESTBED_GO_P:-$(nproc)}"
case "${TESTBED_KUBE:-newest}" in
  newest) K8S_MOD="$TB/k8s"; PROXY_MOD="$TB/kube-proxy"; LINK=current ;;
  oldest) K8S_MOD="$TB/oldest/k8s"; PROXY_MOD="$TB/oldest/kube-proxy"; LINK=oldest ;;
  *) echo "build.sh: error: TESTBED_KUBE must be newest or oldest, not '$TESTBED_KUBE'" >&2; exit 1 ;;
esac

die() { echo "build.sh: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

command -v go >/dev/null || die "go not found on PATH (need Go >= 1.26; /usr/local/go/bin)"
GOV=$(go env GOVERSION)
case "$GOV" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) die "need Go >= 1.26 (kwok v0.8.0 requires go 1.26.0), have $GOV" ;;
esac

modver() { awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && $0 !~ /=>/ { print $2 }' "$1" | head -1; }
K8S_VERSION=$(modver "$K8S_MOD/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(modver "$TB/etcd/go.mod" go.etcd.io/etcd/server/v3)
KWOK_VERSION=$(modver "$TB/kwok/go.mod" sigs.k8s.io/kwok)
[[ -n "$K8S_VERSION" && -n "$ETCD_VERSION" && -n "$KWOK_VERSION" ]] || die "cannot read versions from go.mod files"
PROXY_K8S_VERSION=$(modver "$PROXY_MOD/go.mod" k8s.io/kubernetes)
[[ "$PROXY_K8S_VERSION" == "$K8S_VERSION" ]] \
  || die "kube-proxy/go.mod has k8s.io/kubernetes $PROXY_K8S_VERSION, k8s/go.mod $K8S_VERSION: bump both"

KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_${GOV}"
OUT="$CACHE/$KEY"
BIN="$OUT/bin"
LOGS="$OUT/logs"
STAMPS="$OUT/stamps"
mkdir -p "$BIN" "$LOGS" "$STAMPS"

# --- version ldflags (kubernetes hack/lib/version.sh) ------------------------------------------------------
K8S_MAJOR=$(echo "$K8S_VERSION" | sed -E 's/^v([0-9]+)\..*/\1/')
K8S_MINOR=$(echo "$K8S_VERSION" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')
# The build date is part of the stamp, so pin it to the module's release instead of "now" (reproducible).
K8S_DATE="1970-01-01T00:00:00Z"
k8s_ld=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ld+=" -X '$pkg.gitVersion=$K8S_VERSION' -X '$pkg.gitMajor=$K8S_MAJOR' -X '$pkg.gitMinor=$K8S_MINOR'"
  k8s_ld+=" -X '$pkg.gitTreeState=clean' -X '$pkg.gitCommit=module-$K8S_VERSION' -X '$pkg.buildDate=$K8S_DATE'"
done
K8S_LDFLAGS="-s -w$k8s_ld"
ETCD_LDFLAGS="-s -w -X 'go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION'"
KWOK_LDFLAGS="-s -w -X 'sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}'"

# --- helpers -------------------------------------------------------------------------------------------------
stamp_of() { # <module dir> <ldflags>: hash of every input that changes the output
  { cat "$1/go.mod" "$1/go.sum"; echo "$GOV $CGO_ENABLED $2 -trimpath"; } | sha256sum | cut -d' ' -f1
}

PEAK_FILE="$OUT/.peak_rss_kb"
sample_rss() { # sum of RSS of all go toolchain processes, peak written to $PEAK_FILE (kB)
  local peak=0 cur
  while :; do
    cur=$(ps -e -o rss=,comm= | awk '$2 ~ /^(go|compile|link|asm|cgo|vet)$/ { s += $1 } END { print s + 0 }')
    (( cur > peak )) && peak=$cur && echo "$peak" > "$PEAK_FILE"
    sleep 1
  done
}

STEP=0
TOTAL_STEPS=6
SUMMARY=()
build_step() { # <name> <module dir> <ldflags> <cold-estimate> <outputs...> -- <packages...>
  local name=$1 dir=$2 ld=$3 est=$4; shift 4
  local outs=() pkgs=()
  while [[ $1 != -- ]]; do outs+=("$1"); shift; done; shift
  pkgs=("$@")
  STEP=$((STEP + 1))
  local want stampf="$STAMPS/$name.stamp" t0 missing=0
  want=$(stamp_of "$dir" "$ld")
  for o in "${outs[@]}"; do [[ -x "$BIN/$o" ]] || missing=1; done
  if [[ "${TESTBED_FORCE:-0}" != 1 && $missing == 0 && -f "$stampf" && "$(cat "$stampf")" == "$want" ]]; then
    echo "==> [$STEP/$TOTAL_STEPS] $name: up to date (${outs[*]})"
    SUMMARY+=("$name: up to date")
    return
  fi
  echo "==> [$STEP/$TOTAL_STEPS] building $name (this takes ~$est cold; log: $LOGS/$name.log)"
  t0=$(now)
  rm -f "$PEAK_FILE"
  sample_rss & local sampler=$!
  local rc=0
  (
    cd "$dir"
    set -x
    /usr/bin/time -v -o "$LOGS/$name.time" \
      go build -p "$P" -trimpath -ldflags "$ld" -o "$BIN/${OUT_NAME:-}" "${pkgs[@]}"
  ) >"$LOGS/$name.log" 2>&1 || rc=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
  if (( rc != 0 )); then
    echo "build.sh: $name FAILED (rc=$rc); last lines of $LOGS/$name.log:" >&2
    tail -30 "$LOGS/$name.log" >&2
    exit "$rc"
  fi
  echo "$want" > "$stampf"
  local maxrss sumpeak
  maxrss=$(awk -F': ' '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$LOGS/$name.time")
  sumpeak=$(awk '{ printf "%.0f", $1 / 1024 }' "$PEAK_FILE" 2>/dev/null || echo "?")
  echo "    $name built in $(elapsed "$t0") (largest process ${maxrss} MiB, peak sum of go processes ${sumpeak} MiB)"
  SUMMARY+=("$name: built in $(elapsed "$t0"), largest process ${maxrss} MiB, peak total ${sumpeak} MiB")
}

T_ALL=$(now)
echo "==> test bed: Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, $GOV, -p $P"
echo "    output: $BIN"

# `go build -o dir/` names a binary after its import path minus the major-version suffix: etcd's main package
# is the module root go.etcd.io/etcd/server/v3, so it comes out as "server". Build it alone with -o bin/etcd.
OUT_NAME=etcd build_step etcd "$TB/etcd" "$ETCD_LDFLAGS" "1.5 min" etcd -- go.etcd.io/etcd/server/v3

# kubelet is in the same `go build` as the control plane: they share most of their compile work (the real
# kubelet node of the test bed, see README.md).
build_step kube "$K8S_MOD" "$K8S_LDFLAGS" "9 min" \
  kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet -- \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet

# kube-proxy (the real node's Services; pods reaching the API server) from the same k8s.io/kubernetes version,
# in a wrapper module and step of its own so the control plane's stamp is unchanged; it reuses that build's
# compile cache (~2 min warm).
build_step kube-proxy "$PROXY_MOD" "$K8S_LDFLAGS" "2 min" kube-proxy -- k8s.io/kubernetes/cmd/kube-proxy

build_step kwok "$TB/kwok" "$KWOK_LDFLAGS" "3 min" kwok kwokctl -- \
  sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl

# The DRA kubelet plugin of the real node's DRA tests (dra-driver/main.go); its own module, so its stamp and
# k8s.io/dynamic-resource-allocation version (v0.Y.Z of the test bed's v1.Y.Z) leave the others alone. The
# stamp covers go.mod/go.sum and the ldflags: the sources' hash goes into the ldflags (`--version` prints it).
DRA_SRC=$(cat "$TB"/dra-driver/*.go | sha256sum | cut -c1-16)
OUT_NAME=gpu-dra-driver build_step dra-driver "$TB/dra-driver" "-s -w -X main.sourceHash=$DRA_SRC" "2 min" \
  gpu-dra-driver -- .

# --- [5/5] verify and publish ---------------------------------------------------------------------------------
STEP=$((STEP + 1))
echo "==> [$STEP/$TOTAL_STEPS] verifying binaries"
t0=$(now)
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok kwokctl; do
  [[ -x "$BIN/$b" ]] || die "$BIN/$b missing after the build"
done
ver() { { "$BIN/$1" "${@:2}" 2>&1 || true; } | awk "NR==1" ; }
APISERVER_V=$(ver kube-apiserver --version)
KUBELET_V=$(ver kubelet --version)
PROXY_V=$(ver kube-proxy --version)
KUBECTL_V=$({ "$BIN/kubectl" version --client 2>&1 || true; } | awk "NR==1")
ETCD_V=$(ver etcd --version)
KWOK_V=$(ver kwokctl --version)
for line in "$APISERVER_V" "$KUBELET_V" "$PROXY_V" "$KUBECTL_V" "$ETCD_V" "$KWOK_V"; do echo "    $line"; done
[[ "$APISERVER_V" == *"$K8S_VERSION"* ]] || die "kube-apiserver reports '$APISERVER_V', expected $K8S_VERSION"
[[ "$KUBELET_V" == *"$K8S_VERSION"* ]] || die "kubelet reports '$KUBELET_V', expected $K8S_VERSION"
[[ "$PROXY_V" == *"$K8S_VERSION"* ]] || die "kube-proxy reports '$PROXY_V', expected $K8S_VERSION"
[[ "$ETCD_V" == *"${ETCD_VERSION#v}"* ]] || die "etcd reports '$ETCD_V', expected $ETCD_VERSION"
cat > "$OUT/versions.json" <<EOF
{
  "key": "$KEY",
  "kubernetes": "$K8S_VERSION",
  "etcd": "$ETCD_VERSION",
  "kwok": "$KWOK_VERSION",
  "go": "$GOV",
  "bin": "$BIN"
}
EOF
ln -sfn "$KEY" "$CACHE/$LINK"
SUMMARY+=("verify: $(elapsed "$t0")")

echo "==> test bed ready in $(elapsed "$T_ALL") total: $CACHE/$LINK/bin"
for s in "${SUMMARY[@]}"; do echo "    $s"; done
