#!/usr/bin/env bash
# Writes tenantry's clusterctl release artifacts into a folder (default
# out/release/):
#
#   infrastructure-components.yaml   Namespace, CRDs, RBAC, Deployment, webhook Service,
#                                    cert-manager Issuer + Certificate, webhook configuration
#   metadata.yaml                    release series -> Cluster API contract
#   cluster-template-kubevirt.yaml   } clusterctl generate cluster --flavor kubevirt|proxmox
#   cluster-template-proxmox.yaml    }
#
# The first two are rendered by `tenantry components` from the code they deploy;
# the templates are copied from config/templates/. Upload the folder's files
# as the assets of a GitHub release named v<version>, or point a clusterctl
# `providers:` entry at <folder>/infrastructure-tenantry/<version>/ laid out
# by --repository (see docs/install.md).
#
# Usage: hack/release.sh [--repository] [out-dir]
#   --repository   write <out-dir>/infrastructure-tenantry/v<version>/ (a local
#                  clusterctl repository) instead of <out-dir>/ itself
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repository=false
if [[ "${1:-}" == "--repository" ]]; then
	repository=true
	shift
fi
out="${1:-$root/out/release}"

version="v$(cargo metadata --manifest-path "$root/Cargo.toml" --no-deps --format-version 1 |
	python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tenantry-provider"))')"
if $repository; then
	out="$out/infrastructure-tenantry/$version"
fi
mkdir -p "$out"

cargo run --quiet --manifest-path "$root/Cargo.toml" -p tenantry-provider --bin tenantry -- components --out "$out"
cp "$root"/config/templates/cluster-template-*.yaml "$out/"

echo "tenantry $version release artifacts in $out:"
ls -1 "$out"
