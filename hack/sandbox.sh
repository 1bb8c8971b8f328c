#!/usr/bin/env bash
# The local sandbox: builds what is missing, then runs a real control plane
# with the Cluster API core manager until Ctrl-C or SIGTERM. The admin
# kubeconfig is written to .sandbox/kubeconfig in the repository root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/upstream/build.sh
cargo build --locked -p tenantry-e2e --bin sandbox
exec target/debug/sandbox --kubeconfig .sandbox/kubeconfig "$@"
