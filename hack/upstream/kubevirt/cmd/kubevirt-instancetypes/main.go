// kubevirt-instancetypes prints, as one multi-document YAML stream, the
// common cluster instance types and preferences virt-operator deploys
// (KubeVirt's embedded common-instancetypes bundles), which a platform's VMs
// name (u1.medium, ...). The e2e harness installs them in virt-operator's
// place.
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-instancetypes:", err)
		os.Exit(1)
	}
}

func run() error {
	instancetypes, err := components.NewClusterInstancetypes()
	if err != nil {
		return err
	}
	for _, instancetype := range instancetypes {
		instancetype.APIVersion = "instancetype.kubevirt.io/v1beta1"
		instancetype.Kind = "VirtualMachineClusterInstancetype"
		if err := emit(instancetype); err != nil {
			return err
		}
	}
	preferences, err := components.NewClusterPreferences()
	if err != nil {
		return err
	}
	for _, preference := range preferences {
		preference.APIVersion = "instancetype.kubevirt.io/v1beta1"
		preference.Kind = "VirtualMachineClusterPreference"
		if err := emit(preference); err != nil {
			return err
		}
	}
	return nil
}

func emit(object any) error {
	out, err := yaml.Marshal(object)
	if err != nil {
		return err
	}
	_, err = fmt.Printf("---\n%s", out)
	return err
}
