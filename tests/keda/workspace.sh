# Sourced by build.sh (KEDA's external-scaler client) and build-keda.sh (the KEDA operator and metrics
# server): both compile KEDA's module from one copy of it, so KEDA's own packages are compiled once for both
# (issue 51). keda_workspace <tests/keda dir> <out root> sets GOWORK to a go.work that replaces
# github.com/kedacore/keda/v2 (the version tests/keda/go.mod pins) with <out root>/keda-<version>, a copy of
# the module from the module cache (fetched with `go mod download`, so checked against go.sum), compared
# file by file with it after copying: the same source, at the same version, so the build list is go.mod's.
# Why a copy: the client leaves most of pkg/scalers out with `go build -overlay`, which Go refuses for files
# under GOMODCACHE; building the operator from the same copy keeps the two builds' compile caches shared.
keda_workspace() {
  local here=$1 root=$2 version moddir src stamp want
  version=$(awk '$1 == "github.com/kedacore/keda/v2" && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")
  [[ -n "$version" ]] || { echo "keda: no github.com/kedacore/keda/v2 require in $here/go.mod" >&2; return 1; }
  src="$root/keda-$version"
  stamp="$root/keda-$version.stamp"
  moddir=$(cd "$here" && GOWORK=off go mod download -json "github.com/kedacore/keda/v2@$version" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$moddir/pkg/scalers" ]] || { echo "keda: go mod download gave no directory for $version" >&2; return 1; }
  want=$(cd "$moddir" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [[ ! -d "$src" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    mkdir -p "$root"
    rm -rf "$src" "$src.tmp" "$stamp"
    cp -R "$moddir" "$src.tmp" && chmod -R u+w "$src.tmp"
    local got
    got=$(cd "$src.tmp" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
    [[ "$got" == "$want" ]] || { echo "keda: the copy of $moddir differs from it" >&2; return 1; }
    mv "$src.tmp" "$src"
    echo "$want" > "$stamp"
  fi
  cat > "$root/go.work" <<WORK
go $(awk '$1 == "go" { print $2; exit }' "$here/go.mod")

use $here

replace github.com/kedacore/keda/v2 $version => $src
WORK
  export GOWORK="$root/go.work"
  KEDA_SRC=$src
}
