#!/usr/bin/env bash
# The side-by-side benchmark (docs/performance.md): tenantry against CAPK
# (KubeVirt) and capmox (Proxmox VE) on the same harness and simulators.
#
# Builds what it needs — the upstream binaries, the peers from their Go
# modules (hack/upstream/{capk,capmox}), a release tenantry — then runs every
# setting, prints the side-by-side table and writes it as JSON.
#
#   hack/bench.sh                                   # 100 and 500 machines, CAPI off and on, 3 runs each
#   hack/bench.sh --machines 5000 --capi off        # the memory figure
#   hack/bench.sh --substrates kubevirt --runs 1    # a quick look
#   hack/bench.sh --help                            # every flag
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/upstream/build.sh
hack/upstream/build.sh capk capmox
cargo build --release --locked -p tenantry-provider --bin tenantry -p tenantry-e2e --bin bench

target="${CARGO_TARGET_DIR:-target}"
exec "$target/release/bench" --tenantry "$target/release/tenantry" --json "${BENCH_JSON:-bench-results.json}" "$@"
