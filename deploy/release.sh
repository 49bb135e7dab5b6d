#!/usr/bin/env bash
# `make release`: the release artifacts of this checkout, in dist/<version>/ (docs/release.md pushes them):
#
#   gpuwarden-<version>.tgz            the Helm chart (`helm package`; linted --strict first)
#   gpuwarden-<version>.oci.tar        the image (deploy/image/build.sh's OCI archive for this tree)
#   gpuwarden-<version>.sbom.json      CycloneDX 1.5: the image's Python packages (deploy/sbom.py)
#   SHA256SUMS                         sha256sum of the three
#
# The image must be built for this exact tree (`make image`, content-keyed): a stale archive is refused.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VERSION=$(awk -F'"' '/^version = / { print $2; exit }' pyproject.toml)
CHART_VERSION=$(awk '/^version:/ { print $2; exit }' deploy/helm/gpuwarden/Chart.yaml)
APP_VERSION=$(awk -F'"' '/^appVersion:/ { print $2; exit }' deploy/helm/gpuwarden/Chart.yaml)
PY="${PY:-$ROOT/.venv/bin/python}"
HELM="${HELM:-$ROOT/.cache/helm/current/bin/helm}"
[[ -x "$HELM" ]] || HELM=$(command -v helm) || { echo "helm not found (make helm)" >&2; exit 1; }
[[ "$CHART_VERSION" == "$VERSION" && "$APP_VERSION" == "$VERSION" ]] || {
  echo "version mismatch: pyproject $VERSION, Chart.yaml version $CHART_VERSION appVersion $APP_VERSION" >&2; exit 1; }

OUT="$ROOT/dist/$VERSION"
rm -rf "$OUT" && mkdir -p "$OUT"
echo "==> chart: helm lint --strict, helm package"
"$HELM" lint --strict deploy/helm/gpuwarden >/dev/null
"$HELM" package deploy/helm/gpuwarden -d "$OUT" >/dev/null
echo "==> image: the OCI archive of this tree"
archive=$(bash deploy/image/build.sh --archive)
cp "$archive" "$OUT/gpuwarden-$VERSION.oci.tar"
echo "==> SBOM: the image's Python packages"
"$PY" deploy/sbom.py --version "$VERSION" > "$OUT/gpuwarden-$VERSION.sbom.json"
( cd "$OUT" && sha256sum "gpuwarden-$VERSION.tgz" "gpuwarden-$VERSION.oci.tar" "gpuwarden-$VERSION.sbom.json" > SHA256SUMS )
echo "==> dist/$VERSION"
( cd "$OUT" && ls -l && cat SHA256SUMS )
