#!/usr/bin/env bash
# Writes tenantry's release into a folder (default out/release/):
#
#   infrastructure-components.yaml   Namespace, CRDs, RBAC, Deployment, webhook Service,
#                                    cert-manager Issuer + Certificate, webhook
#                                    configurations; the manager image pinned by digest
#   metadata.yaml                    release series -> Cluster API contract
#   cluster-template.yaml            } clusterctl generate cluster [--flavor kubevirt|proxmox]
#   cluster-template-kubevirt.yaml   }   (the default template is the KubeVirt one)
#   cluster-template-proxmox.yaml    }
#   monitoring/                      ServiceMonitor, PrometheusRule, Grafana dashboard and
#                                    kube-state-metrics configuration (config/monitoring/,
#                                    docs/observability.md); optional, applied by hand
#   tenantry-<version>.oci.tar       the multi-arch image (hack/image.sh), an OCI archive
#   image-digest                     its index digest
#
# The image is built first (hack/image.sh) and the components name it as
# <image-repository>:<version>@<digest>, so what clusterctl installs is
# exactly the image built here, whatever later happens to the tag. Upload the
# files as the assets of a GitHub release named v<version> and push the image
# (.github/workflows/release.yaml does both), or point a clusterctl
# `providers:` entry at <folder>/infrastructure-tenantry/<version>/ laid out
# by --repository (see docs/install.md).
#
# Usage: hack/release.sh [--repository] [--image-repository REPO] [out-dir]
#   --repository         write <out-dir>/infrastructure-tenantry/v<version>/ (a local
#                        clusterctl repository) instead of <out-dir>/ itself
#   --image-repository   where the image is pushed (default ghcr.io/tenantry/tenantry)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repository=false
image_repository=ghcr.io/tenantry/tenantry
while [[ $# -gt 0 ]]; do
	case "$1" in
	--repository) repository=true; shift ;;
	--image-repository) image_repository="$2"; shift 2 ;;
	-*) echo "usage: $0 [--repository] [--image-repository REPO] [out-dir]" >&2; exit 2 ;;
	*) break ;;
	esac
done
out="${1:-$root/out/release}"

version="v$(cargo metadata --manifest-path "$root/Cargo.toml" --no-deps --format-version 1 |
	python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tenantry-provider"))')"
if $repository; then
	out="$out/infrastructure-tenantry/$version"
fi
mkdir -p "$out"

image_out="$(mktemp -d)"
trap 'rm -rf "$image_out"' EXIT
"$root/hack/image.sh" --out "$image_out"
digest="$(cat "$image_out/digest")"
image="$image_repository:$version@$digest"

cargo run --quiet --locked --manifest-path "$root/Cargo.toml" -p tenantry-provider --bin tenantry -- \
	components --out "$out" --image "$image"
cp "$root"/config/templates/cluster-template*.yaml "$out/"
mkdir -p "$out/monitoring"
cp "$root"/config/monitoring/* "$out/monitoring/"
cp "$image_out/tenantry-$version.oci.tar" "$out/"
echo "$digest" >"$out/image-digest"

echo "tenantry $version release in $out (image $image):"
ls -1 "$out"
