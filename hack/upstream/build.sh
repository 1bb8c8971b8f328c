#!/usr/bin/env bash
# Builds the upstream Go programs tenantry's tests run for real (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, etcd, the Cluster API core manager,
# clusterctl, the in-cluster IPAM provider, kustomize, CABPT, Talos's config
# validator, promcheck over Prometheus's parsers, actionlint,
# kube-state-metrics) from the pinned
# wrapper modules next to this script, into a cache outside the work tree.
#
# Each binary lands in  $TENANTRY_CACHE/upstream/<name>-<version>/<name>  and
# $TENANTRY_CACHE/upstream/bin/<name> is a symlink to the version this checkout
# pins; kube-apiserver of the oldest tenant minor, the previous and the newest
# minor (wrappers kubernetes-1.31/, kubernetes-1.34/, kubernetes-1.36/) is
# linked as bin/kube-apiserver-v1.31, -v1.34 and -v1.36 next to it, and the Cluster API core manager of
# the v1beta1 generation (v1.10, wrapper cluster-api-1.10/) as
# bin/cluster-api-manager-v1.10. Binaries already present are not rebuilt, so
# a warm run is a no-op.
# The Cluster API CRDs and webhook manifests, which ship inside its Go module,
# are copied to $TENANTRY_CACHE/upstream/cluster-api/{crd,webhook} (v1.10's
# to upstream/cluster-api-v1.10/{crd,webhook}), and its
# clusterctl release artifacts (core-components.yaml, metadata.yaml) are
# rendered with kustomize into $TENANTRY_CACHE/upstream/cluster-api-release;
# cert-manager's CRDs go to $TENANTRY_CACHE/upstream/cert-manager/crd.
#
# The peer providers tenantry takes clusters over from and is benchmarked
# against (capk, capmox) are built too; their CRDs and metadata.yaml go to
# $TENANTRY_CACHE/upstream/<name>/{crd,metadata.yaml}.
#
# Usage: hack/upstream/build.sh [name ...]     (default: everything)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${TENANTRY_CACHE:-$HOME/.cache/tenantry}/upstream"
mkdir -p "$cache/bin"

# Go fetches modules from the proxy; -buildvcs=false because the wrapper
# modules live inside our git tree and their VCS state is not the upstream's.
export GOFLAGS="${GOFLAGS:-} -buildvcs=false -mod=mod"
export CGO_ENABLED=0

# version_of <wrapper dir> <module path>: the version the wrapper's go.mod pins.
version_of() {
	awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' \
		"$here/$1/go.mod" | head -n 1
}

# module_dir <wrapper dir> <module path>: the module's folder in the Go module
# cache, downloading it first if needed.
module_dir() {
	(cd "$here/$1" && go mod download -json "$2" | awk -F'"' '$2 == "Dir" { print $4 }')
}

# copy_config <name> <wrapper> <module> <version> [link]: copies a provider's
# CRDs and webhook manifests (config/crd/bases, config/webhook) out of its
# module into the cache, once, and links them as upstream/<link>/{crd,webhook}
# (default <name>).
copy_config() {
	local name="$1" wrapper="$2" module="$3" version="$4" link="${5:-$1}"
	local config="$cache/$name-$version/config"
	if [[ ! -d "$config" ]]; then
		local dir
		dir="$(module_dir "$wrapper" "$module")"
		rm -rf "$config.partial"
		mkdir -p "$config.partial"
		cp -r "$dir/config/crd/bases" "$config.partial/crd"
		cp -r "$dir/config/webhook" "$config.partial/webhook"
		chmod -R u+w "$config.partial"
		mv "$config.partial" "$config"
	fi
	ln -sfn "$name-$version/config" "$cache/$link"
}

build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
built=()

# build <name> <wrapper dir> <package> <version> [ldflags] [link]
# [link] is the name under bin/ (default <name>); a second minor of the same
# program gets its own, e.g. bin/kube-apiserver-v1.34.
build() {
	local name="$1" wrapper="$2" pkg="$3" version="$4" ldflags="${5:-}" link="${6:-$1}"
	local dest="$cache/$name-$version/$name"
	if [[ ! -x "$dest" ]]; then
		echo "==> building $name $version ($pkg)"
		local start=$SECONDS
		mkdir -p "$(dirname "$dest")"
		(cd "$here/$wrapper" && go build -trimpath -ldflags "-s -w $ldflags" -o "$dest.partial" "$pkg")
		mv "$dest.partial" "$dest"
		echo "    built $name in $((SECONDS - start))s"
		built+=("$link")
	fi
	# Relative links keep the cache valid if it is moved or mounted elsewhere.
	ln -sfn "../$name-$version/$name" "$cache/bin/$link"
}

# peer NAME MODULE PACKAGE: a peer provider's manager, its CRDs
# (config/crd/bases, copied to upstream/NAME/crd) and its metadata.yaml.
peer() {
	local name="$1" module="$2" pkg="$3"
	sel "$name" || return 0
	local version
	version="$(version_of "$name" "$module")"
	build "$name" "$name" "$pkg" "$version"
	local config="$cache/$name-$version/config"
	if [[ ! -d "$config" ]]; then
		local dir
		dir="$(module_dir "$name" "$module")"
		rm -rf "$config.partial"
		mkdir -p "$config.partial"
		cp -r "$dir/config/crd/bases" "$config.partial/crd"
		cp "$dir/metadata.yaml" "$config.partial/metadata.yaml"
		chmod -R u+w "$config.partial"
		mv "$config.partial" "$config"
	fi
	ln -sfn "$name-$version/config" "$cache/$name"
}

sel() {
	[[ ${#selected[@]} -eq 0 ]] && return 0
	local n
	for n in "${selected[@]}"; do [[ "$n" == "$1" ]] && return 0; done
	return 1
}

main() {
	# --- Kubernetes: kube-apiserver, kube-controller-manager, kubectl----------------------------
	k8s_version="$(version_of kubernetes k8s.io/kubernetes)"
	k8s_minor="$(echo "$k8s_version" | cut -d. -f2)"
	k8s_ldflags=""
	# Unstamped binaries report v0.0.0-master, which CAPI refuses as a
	# management cluster version.
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
		k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
	done
	if sel kube-apiserver; then
		build kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver "$k8s_version" "$k8s_ldflags"
	fi
	if sel kube-controller-manager; then
		build kube-controller-manager kubernetes k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_version" "$k8s_ldflags"
	fi
	if sel kubectl; then
		build kubectl kubernetes k8s.io/kubernetes/cmd/kubectl "$k8s_version" "$k8s_ldflags"
	fi
	# The management cluster of the deployed-manager tests schedules pods.
	if sel kube-scheduler; then
		build kube-scheduler kubernetes k8s.io/kubernetes/cmd/kube-scheduler "$k8s_version" "$k8s_ldflags"
	fi

	# --- kube-apiserver of other minors ------------------------------------------
	# The tenant control plane simulator runs the kube-apiserver of the minor a
	# KamajiControlPlane asks for (and upgrades it in place), so the oldest
	# minor tenants run (v1.31) and the previous one are built too; the management-version matrix test installs
	# tenantry on the newest minor. Each comes from its own wrapper and is
	# linked as bin/kube-apiserver-v<major>.<minor>; they share one etcd.
	for wrapper in kubernetes-1.31 kubernetes-1.34 kubernetes-1.36; do
		minor_version="$(version_of "$wrapper" k8s.io/kubernetes)"
		minor="$(echo "$minor_version" | cut -d. -f2)"
		minor_ldflags=""
		for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			minor_ldflags+=" -X $pkg.gitVersion=$minor_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
			minor_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
		done
		if sel "kube-apiserver-v1.$minor"; then
			build kube-apiserver "$wrapper" k8s.io/kubernetes/cmd/kube-apiserver "$minor_version" \
				"$minor_ldflags" "kube-apiserver-v1.$minor"
		fi
	done

	# --- etcd ------------------------------------------------------------------
	etcd_version="$(version_of etcd go.etcd.io/etcd/server/v3)"
	if sel etcd; then
		build etcd etcd go.etcd.io/etcd/server/v3 "$etcd_version"
	fi

	# --- Cluster API: core manager and clusterctl ------------------------------
	capi_version="$(version_of cluster-api sigs.k8s.io/cluster-api)"
	capi_ldflags=""
	capi_minor="$(echo "$capi_version" | cut -d. -f2)"
	for key in "gitVersion=$capi_version" "gitMajor=1" "gitMinor=$capi_minor" "gitTreeState=clean" "buildDate=$build_date"; do
		capi_ldflags+=" -X sigs.k8s.io/cluster-api/version.$key"
	done
	if sel cluster-api-manager; then
		build cluster-api-manager cluster-api sigs.k8s.io/cluster-api/core "$capi_version" "$capi_ldflags"
	fi
	if sel clusterctl; then
		build clusterctl cluster-api sigs.k8s.io/cluster-api/cmd/clusterctl "$capi_version" "$capi_ldflags"
	fi
	if sel cluster-api-manager || sel clusterctl; then
		# The CRDs and webhook manifests ship inside the module; copy them next to
		# the binaries so tests find them even if the Go module cache is cleaned.
		capi_config="$cache/cluster-api-$capi_version/config"
		if [[ ! -d "$capi_config" ]]; then
			capi_dir="$(module_dir cluster-api sigs.k8s.io/cluster-api)"
			rm -rf "$capi_config.partial"
			mkdir -p "$capi_config.partial"
			cp -r "$capi_dir/core/config/crd/bases" "$capi_config.partial/crd"
			cp -r "$capi_dir/core/config/webhook" "$capi_config.partial/webhook"
			chmod -R u+w "$capi_config.partial"
			mv "$capi_config.partial" "$capi_config"
		fi
		ln -sfn "cluster-api-$capi_version/config" "$cache/cluster-api"
	fi

	# --- Cluster API v1.10: the core manager of the v1beta1 generation --------
	# The last minor that serves cluster.x-k8s.io v1beta1 only; the harness
	# runs it instead of the pinned one when a test asks for it
	# (e2e/src/cluster_api.rs, ClusterApiRelease::V1_10). Its main package is
	# the module root, its CRDs and webhook manifests are under config/ (v1.14
	# moved both under core/). No clusterctl: the tests use the pinned one.
	capi110_version="$(version_of cluster-api-1.10 sigs.k8s.io/cluster-api)"
	capi110_minor="$(echo "$capi110_version" | cut -d. -f2)"
	if sel "cluster-api-manager-v1.$capi110_minor"; then
		capi110_ldflags=""
		for key in "gitVersion=$capi110_version" "gitMajor=1" "gitMinor=$capi110_minor" "gitTreeState=clean" \
			"buildDate=$build_date"; do
			capi110_ldflags+=" -X sigs.k8s.io/cluster-api/version.$key"
		done
		build cluster-api-manager cluster-api-1.10 sigs.k8s.io/cluster-api "$capi110_version" "$capi110_ldflags" \
			"cluster-api-manager-v1.$capi110_minor"
		copy_config cluster-api cluster-api-1.10 sigs.k8s.io/cluster-api "$capi110_version" \
			"cluster-api-v1.$capi110_minor"
	fi

	# --- kustomize, and Cluster API's clusterctl release artifacts ------------
	kustomize_version="$(version_of kustomize sigs.k8s.io/kustomize/kustomize/v5)"
	if sel kustomize || sel clusterctl; then
		build kustomize kustomize sigs.k8s.io/kustomize/kustomize/v5 "$kustomize_version"
	fi
	if sel clusterctl; then
		# What Cluster API's `make release-manifests` does for the core provider:
		# `manifest-modification` points the image patch at the production
		# registry with the release tag and the pull policy at IfNotPresent, then
		# `kustomize build core/config/default` > core-components.yaml, and the
		# module's metadata.yaml is copied next to it. clusterctl tests install
		# the core provider from these files through a local repository.
		capi_release="$cache/cluster-api-$capi_version/release"
		if [[ ! -f "$capi_release/core-components.yaml" ]]; then
			echo "==> rendering Cluster API $capi_version core-components.yaml"
			capi_dir="$(module_dir cluster-api sigs.k8s.io/cluster-api)"
			work="$(mktemp -d)"
			cp -r "$capi_dir/core" "$work/core"
			chmod -R u+w "$work"
			sed -i -e "s@image: .*@image: registry.k8s.io/cluster-api/cluster-api-controller:$capi_version@" \
				"$work/core/config/default/manager_image_patch.yaml"
			sed -i -e 's@imagePullPolicy: .*@imagePullPolicy: IfNotPresent@' \
				"$work/core/config/default/manager_pull_policy.yaml"
			rm -rf "$capi_release.partial"
			mkdir -p "$capi_release.partial"
			"$cache/bin/kustomize" build "$work/core/config/default" >"$capi_release.partial/core-components.yaml"
			cp "$capi_dir/metadata.yaml" "$capi_release.partial/metadata.yaml"
			chmod -R u+w "$capi_release.partial"
			rm -rf "$work"
			mv "$capi_release.partial" "$capi_release"
		fi
		ln -sfn "cluster-api-$capi_version/release" "$cache/cluster-api-release"
	fi

	# --- cert-manager CRDs ------------------------------------------------------
	# What `clusterctl init` checks for (see e2e/src/clusterctl.rs), and what
	# the cert-manager controller below serves.
	certmanager_module=github.com/cert-manager/cert-manager
	certmanager_version="$(version_of cert-manager "$certmanager_module")"
	if sel clusterctl || sel cert-manager-controller || sel cert-manager-cainjector; then
		certmanager_config="$cache/cert-manager-$certmanager_version/config"
		if [[ ! -d "$certmanager_config" ]]; then
			certmanager_dir="$(module_dir cert-manager "$certmanager_module")"
			rm -rf "$certmanager_config.partial"
			mkdir -p "$certmanager_config.partial"
			cp -r "$certmanager_dir/deploy/crds" "$certmanager_config.partial/crd"
			rm -f "$certmanager_config.partial/crd/README.md"
			chmod -R u+w "$certmanager_config.partial"
			mv "$certmanager_config.partial" "$certmanager_config"
		fi
		ln -sfn "cert-manager-$certmanager_version/config" "$cache/cert-manager"
	fi

	# --- cert-manager controller and CA injector -------------------------------
	# Upstream's main packages live in nested modules the proxy does not serve,
	# so the wrapper's own small mains (cert-manager-bin/cmd) wire the module's
	# public packages as upstream's cmd/*/app do. Stamped like upstream's
	# Makefile (pkg/util.AppVersion). They need the CRDs above, so selecting
	# them copies those too.
	certmanager_bin_version="$(version_of cert-manager-bin "$certmanager_module")"
	certmanager_ldflags="-X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$certmanager_bin_version"
	if sel cert-manager-controller; then
		build cert-manager-controller cert-manager-bin \
			tenantry.dev/hack/upstream/cert-manager-bin/cmd/controller "$certmanager_bin_version" "$certmanager_ldflags"
	fi
	if sel cert-manager-cainjector; then
		build cert-manager-cainjector cert-manager-bin \
			tenantry.dev/hack/upstream/cert-manager-bin/cmd/cainjector "$certmanager_bin_version" "$certmanager_ldflags"
	fi

	# --- Cluster API in-cluster IPAM provider ----------------------------------
	ipam_module=sigs.k8s.io/cluster-api-ipam-provider-in-cluster
	ipam_version="$(version_of ipam-in-cluster "$ipam_module")"
	if sel ipam-in-cluster; then
		build ipam-in-cluster ipam-in-cluster "$ipam_module" "$ipam_version"
		copy_config ipam-in-cluster ipam-in-cluster "$ipam_module" "$ipam_version"
	fi

	# --- CABPT, the Talos bootstrap provider, and Talos's config validator ------
	# CABPT renders the workers' bootstrap data Secrets from TalosConfigs; its
	# CRDs and webhook manifests are copied next to the binary and linked as
	# upstream/cabpt/{crd,webhook}. talos-config is the wrapper's own small
	# main over Talos's machinery: it loads and validates a machine config as
	# a Talos node does (the simulated workers ask it before they join).
	cabpt_module=github.com/siderolabs/cluster-api-bootstrap-provider-talos
	cabpt_version="$(version_of cabpt "$cabpt_module")"
	if sel cabpt; then
		build cabpt cabpt "$cabpt_module" "$cabpt_version"
		copy_config cabpt cabpt "$cabpt_module" "$cabpt_version"
	fi
	talos_version="$(version_of talos-config github.com/siderolabs/talos/pkg/machinery)"
	if sel talos-config; then
		build talos-config talos-config tenantry.dev/hack/upstream/talos-config "$talos_version"
	fi

	# --- promcheck: Prometheus's rule, PromQL and scrape parsers ---------------
	# The wrapper's own small main over github.com/prometheus/prometheus: it
	# checks config/monitoring's rules and dashboard queries, and reads
	# tenantry's /metrics with the parser a Prometheus scrape uses.
	prometheus_version="$(version_of prometheus github.com/prometheus/prometheus)"
	if sel prometheus || sel promcheck; then
		build promcheck prometheus tenantry.dev/hack/upstream/prometheus "$prometheus_version"
	fi

	# --- KubeVirt: virt-api and virt-controller --------------------------------
	# The e2e harness plays virt-operator (e2e/src/kubevirt_upstream.rs): it
	# installs what kubevirt-manifests prints from KubeVirt's own generators
	# (CRDs, RBAC, virt-api's webhook configurations), written next to the
	# binaries and linked as upstream/kubevirt/kubevirt.yaml, and the common
	# instance types and preferences virt-operator deploys
	# (kubevirt-instancetypes, upstream/kubevirt/instancetypes.yaml).
	kubevirt_version="$(version_of kubevirt kubevirt.io/kubevirt)"
	if sel kubevirt; then
		kubevirt_ldflags=""
		for pair in "gitVersion=$kubevirt_version" gitTreeState=clean "buildDate=$build_date"; do
			kubevirt_ldflags+=" -X kubevirt.io/client-go/version.$pair"
		done
		build virt-api kubevirt kubevirt.io/kubevirt/cmd/virt-api "$kubevirt_version" "$kubevirt_ldflags"
		build virt-controller kubevirt kubevirt.io/kubevirt/cmd/virt-controller "$kubevirt_version" \
			"$kubevirt_ldflags"
		build kubevirt-manifests kubevirt tenantry.dev/hack/upstream/kubevirt/cmd/kubevirt-manifests \
			"$kubevirt_version"
		local manifests="$cache/kubevirt-$kubevirt_version/config"
		if [[ ! -s "$manifests/kubevirt.yaml" ]]; then
			mkdir -p "$manifests"
			"$cache/bin/kubevirt-manifests" kubevirt >"$manifests/kubevirt.yaml.partial"
			mv "$manifests/kubevirt.yaml.partial" "$manifests/kubevirt.yaml"
		fi
		build kubevirt-instancetypes kubevirt \
			tenantry.dev/hack/upstream/kubevirt/cmd/kubevirt-instancetypes "$kubevirt_version"
		if [[ ! -s "$manifests/instancetypes.yaml" ]]; then
			"$cache/bin/kubevirt-instancetypes" >"$manifests/instancetypes.yaml.partial"
			mv "$manifests/instancetypes.yaml.partial" "$manifests/instancetypes.yaml"
		fi
		ln -sfn "kubevirt-$kubevirt_version/config" "$cache/kubevirt"
	fi
	# CDI's CRDs as its operator installs them (virt-controller lists all of
	# them once DataVolumes exist), linked as upstream/cdi/cdi-crds.yaml.
	cdi_version="$(version_of cdi kubevirt.io/containerized-data-importer)"
	if sel kubevirt || sel cdi; then
		build cdi-crds cdi tenantry.dev/hack/upstream/cdi/cmd/cdi-crds "$cdi_version"
		local cdi_config="$cache/cdi-$cdi_version/config"
		if [[ ! -s "$cdi_config/cdi-crds.yaml" ]]; then
			mkdir -p "$cdi_config"
			"$cache/bin/cdi-crds" >"$cdi_config/cdi-crds.yaml.partial"
			mv "$cdi_config/cdi-crds.yaml.partial" "$cdi_config/cdi-crds.yaml"
		fi
		ln -sfn "cdi-$cdi_version/config" "$cache/cdi"
	fi

	# --- Cluster API Operator ---------------------------------------------------
	# Installs providers from CoreProvider/InfrastructureProvider/... objects, as
	# the hosting platform does (e2e/src/cluster_api_operator.rs). Its CRDs and
	# webhook manifests ship inside the module; they are copied next to the
	# binary and linked as upstream/cluster-api-operator/{crd,webhook}.
	operator_module=sigs.k8s.io/cluster-api-operator
	operator_version="$(version_of cluster-api-operator "$operator_module")"
	if sel cluster-api-operator; then
		# What the operator's Makefile stamps (hack/version.sh).
		operator_ldflags=""
		operator_major="$(echo "$operator_version" | cut -d. -f1 | tr -d v)"
		operator_minor="$(echo "$operator_version" | cut -d. -f2)"
		for key in "gitVersion=$operator_version" "gitMajor=$operator_major" "gitMinor=$operator_minor" \
			"gitTreeState=clean" "buildDate=$build_date"; do
			operator_ldflags+=" -X $operator_module/version.$key"
		done
		build cluster-api-operator cluster-api-operator "$operator_module/cmd" "$operator_version" "$operator_ldflags"
		copy_config cluster-api-operator cluster-api-operator "$operator_module" "$operator_version"
	fi

	# --- actionlint: lints .github/workflows (hack/test.sh) --------------------
	actionlint_version="$(version_of actionlint github.com/rhysd/actionlint)"
	if sel actionlint; then
		build actionlint actionlint github.com/rhysd/actionlint/cmd/actionlint "$actionlint_version" \
			"-X github.com/rhysd/actionlint.version=$actionlint_version"
	fi

	# --- kube-state-metrics: serves config/monitoring/kube-state-metrics.yaml ---
	# Stamped as upstream's Makefile does (prometheus/common's version
	# package, and the client-go version it reports in its build info).
	ksm_version="$(version_of kube-state-metrics k8s.io/kube-state-metrics/v2)"
	if sel kube-state-metrics; then
		ksm_client_go="$(version_of kube-state-metrics k8s.io/client-go)"
		ksm_ldflags="-X github.com/prometheus/common/version.Version=$ksm_version"
		ksm_ldflags+=" -X github.com/prometheus/common/version.BuildDate=$build_date"
		ksm_ldflags+=" -X k8s.io/kube-state-metrics/v2/pkg/app.ClientGoVersion=$ksm_client_go"
		build kube-state-metrics kube-state-metrics k8s.io/kube-state-metrics/v2 "$ksm_version" "$ksm_ldflags"
	fi

	# --- Peer providers: the takeover tests and hack/bench.sh -----------------
	peer capk sigs.k8s.io/cluster-api-provider-kubevirt sigs.k8s.io/cluster-api-provider-kubevirt
	peer capmox github.com/ionos-cloud/cluster-api-provider-proxmox \
		github.com/ionos-cloud/cluster-api-provider-proxmox/cmd

	if [[ ${#built[@]} -eq 0 ]]; then
		echo "upstream binaries up to date in $cache/bin"
	else
		echo "built: ${built[*]} (cache: $cache/bin)"
	fi
	if [[ -e "$cache/cluster-api" ]]; then
		echo "Cluster API CRDs: $cache/cluster-api/crd (webhooks: $cache/cluster-api/webhook)"
	fi
	if [[ -e "$cache/cluster-api-v1.10" ]]; then
		echo "Cluster API v1.10 CRDs: $cache/cluster-api-v1.10/crd (webhooks: $cache/cluster-api-v1.10/webhook)"
	fi
}

selected=("$@")
main
exit
