// kubevirt-manifests prints, as one multi-document YAML stream, what
// virt-operator installs for virt-api and virt-controller and the e2e
// harness installs in its place: every KubeVirt CRD; the ServiceAccounts,
// roles and bindings of virt-api, virt-controller and virt-handler; and
// virt-api's mutating and validating webhook configurations, for the install
// namespace (first argument, default "kubevirt"). Everything comes from KubeVirt's own
// generators, so the harness registers exactly what a KubeVirt release does;
// the harness only points the webhooks at the local virt-api and sets the
// CA bundle.
package main

import (
	"fmt"
	"os"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
)

func main() {
	namespace := "kubevirt"
	if len(os.Args) > 1 {
		namespace = os.Args[1]
	}
	if err := run(namespace); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-manifests:", err)
		os.Exit(1)
	}
}

func run(namespace string) error {
	generators := []func() (*extv1.CustomResourceDefinition, error){
		components.NewKubeVirtCrd,
		components.NewVirtualMachineInstanceCrd,
		components.NewPresetCrd,
		components.NewReplicaSetCrd,
		components.NewVirtualMachineCrd,
		components.NewVirtualMachineInstanceMigrationCrd,
		components.NewVirtualMachinePoolCrd,
		components.NewVirtualMachineSnapshotCrd,
		components.NewVirtualMachineSnapshotContentCrd,
		components.NewVirtualMachineRestoreCrd,
		components.NewVirtualMachineExportCrd,
		components.NewVirtualMachineBackupCrd,
		components.NewVirtualMachineBackupTrackerCrd,
		components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd,
		components.NewVirtualMachinePreferenceCrd,
		components.NewVirtualMachineClusterPreferenceCrd,
		components.NewMigrationPolicyCrd,
		components.NewVirtualMachineCloneCrd,
	}
	for _, generate := range generators {
		crd, err := generate()
		if err != nil {
			return err
		}
		crd.APIVersion = "apiextensions.k8s.io/v1"
		crd.Kind = "CustomResourceDefinition"
		if err := emit(crd); err != nil {
			return err
		}
	}
	// The ServiceAccounts matter beyond RBAC: virt-api's admission lets
	// only these users write a VMI's status and reserved labels.
	roles := rbac.GetAllApiServer(namespace)
	roles = append(roles, rbac.GetAllController(namespace, false)...)
	roles = append(roles, rbac.GetAllHandler(namespace)...)
	for _, object := range roles {
		if err := emit(object); err != nil {
			return err
		}
	}
	mutating := components.NewVirtAPIMutatingWebhookConfiguration(namespace)
	mutating.APIVersion = "admissionregistration.k8s.io/v1"
	mutating.Kind = "MutatingWebhookConfiguration"
	if err := emit(mutating); err != nil {
		return err
	}
	validating := components.NewVirtAPIValidatingWebhookConfiguration(namespace)
	validating.APIVersion = "admissionregistration.k8s.io/v1"
	validating.Kind = "ValidatingWebhookConfiguration"
	return emit(validating)
}

func emit(object any) error {
	out, err := yaml.Marshal(object)
	if err != nil {
		return err
	}
	_, err = fmt.Printf("---\n%s", out)
	return err
}
