#!/usr/bin/env bash
# The local sandbox: builds what is missing, then runs a real control plane
# with the Cluster API core manager until Ctrl-C or SIGTERM. The admin
# kubeconfig is written to .sandbox/kubeconfig in the repository root.
# With --deployed, Cluster API and tenantry run as pods from their images
# (tenantry's built here by hack/image.sh), installed by clusterctl; that
# needs root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/upstream/build.sh
for arg in "$@"; do
	if [[ "$arg" == --deployed ]]; then
		# Incremental, like hack/test.sh: shares its image build.
		CARGO_INCREMENTAL=1 hack/image.sh --platforms linux/amd64
	fi
done
cargo build --locked -p tenantry-e2e --bin sandbox
exec target/debug/sandbox --kubeconfig .sandbox/kubeconfig "$@"
