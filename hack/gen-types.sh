#!/usr/bin/env bash
# Regenerates the Rust types of the third-party kinds tenantry reads and
# writes (api/src/generated/) with kopium, from upstream CRDs:
#   - KubeVirt and CDI: e2e/fixtures/upstream/{kubevirt,cdi} (copies of the
#     project's shared reference data),
#   - Cluster API v1beta2: the CRDs of the pinned Cluster API module, copied
#     into the upstream cache by hack/upstream/build.sh,
#   - in-cluster IPAM: e2e/fixtures/upstream/ipam-in-cluster,
#   - Kamaji (DataStore), its Cluster API control-plane provider
#     (KamajiControlPlane v1alpha2) and Cozystack's etcd-operator
#     (EtcdCluster): e2e/fixtures/upstream/{kamaji,kamaji-cp-provider,etcd-operator}.
# Requires kopium (cargo install kopium --version 0.24.1 --locked).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KOPIUM_VERSION=0.24.1
if ! kopium --version 2>/dev/null | grep -q "$KOPIUM_VERSION"; then
	echo "kopium $KOPIUM_VERSION is required: cargo install kopium --version $KOPIUM_VERSION --locked" >&2
	exit 1
fi
capi="${TENANTRY_CACHE:-$HOME/.cache/tenantry}/upstream/cluster-api/crd"
[[ -d "$capi" ]] || hack/upstream/build.sh cluster-api-manager
fixtures=e2e/fixtures/upstream
out=api/src/generated

# gen <module path> <crd file> [kopium flags...]
# --no-condition: third-party conditions are not metav1 Conditions to rely on
# (KubeVirt and CDI leave reason or lastTransitionTime empty, CAPI's
# deprecated v1beta1 conditions carry severity), so each kind gets its own
# lenient condition type instead of k8s-openapi's strict one.
gen() {
	local module="$1" crd="$2"
	shift 2
	mkdir -p "$(dirname "$out/$module.rs")"
	# Drop kopium's header line naming the absolute input path, so the output
	# does not depend on where the repository lives.
	kopium --no-condition --docs --schema=derived --derive=JsonSchema --derive=Default --smart-derive-elision --derive=PartialEq "$@" -f "$crd" \
		| sed '/^\/\/ kopium command:/d' >"$out/$module.rs"
	echo "generated $out/$module.rs"
}

# One deliberate relaxation: CDI defaults a DataVolume's source PVC namespace
# to the DataVolume's own, and CAPK's Talos templates leave it out, so
# tenantry accepts it unset (and fills it in when rendering the VM).
relaxed_vm_crd="$(mktemp --suffix=.yaml)"
trap 'rm -f "$relaxed_vm_crd"' EXIT
python3 - "$fixtures/kubevirt/kubevirt.io_virtualmachines.yaml" "$relaxed_vm_crd" <<'PY'
import sys, yaml
crd = yaml.safe_load(open(sys.argv[1]))
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
pvc = schema["properties"]["spec"]["properties"]["dataVolumeTemplates"]["items"]["properties"]["spec"]["properties"]["source"]["properties"]["pvc"]
pvc["required"] = [r for r in pvc["required"] if r != "namespace"]
yaml.safe_dump(crd, open(sys.argv[2], "w"), sort_keys=False)
PY
gen kubevirt/virtual_machine "$relaxed_vm_crd"
gen kubevirt/virtual_machine_instance "$fixtures/kubevirt/kubevirt.io_virtualmachineinstances.yaml"
gen cdi/data_volume "$fixtures/cdi/cdi.kubevirt.io_datavolumes.yaml"
for pair in cluster:clusters machine:machines machine_deployment:machinedeployments \
	machine_set:machinesets machine_health_check:machinehealthchecks; do
	gen "capi/${pair%%:*}" "$capi/cluster.x-k8s.io_${pair#*:}.yaml" --api-version v1beta2
done
for pair in ip_address_claim:ipaddressclaims ip_address:ipaddresses; do
	gen "capi/${pair%%:*}" "$capi/ipam.cluster.x-k8s.io_${pair#*:}.yaml" --api-version v1beta2
done
gen ipam/in_cluster_ip_pool "$fixtures/ipam-in-cluster/crds/ipam.cluster.x-k8s.io_inclusterippools.yaml" --api-version v1alpha2
gen kamaji/data_store "$fixtures/kamaji/crds/kamaji.clastix.io_datastores.yaml" --api-version v1alpha1
gen kamaji/kamaji_control_plane "$fixtures/kamaji-cp-provider/crds/controlplane.cluster.x-k8s.io_kamajicontrolplanes.yaml" --api-version v1alpha2
gen etcd_operator/etcd_cluster "$fixtures/etcd-operator/crds/etcd-operator.cozystack.io_etcdclusters.yaml" --api-version v1alpha2
cargo fmt -p tenantry-api
