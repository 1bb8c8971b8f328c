// Command cdi-crds prints the CustomResourceDefinitions CDI's operator
// installs, from CDI's own generated copy, as one YAML stream.
package main

import (
	"fmt"
	"sort"

	"kubevirt.io/containerized-data-importer/pkg/operator/resources"
)

func main() {
	names := make([]string, 0, len(resources.CDICRDs))
	for name := range resources.CDICRDs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("---\n%s\n", resources.CDICRDs[name])
	}
}
