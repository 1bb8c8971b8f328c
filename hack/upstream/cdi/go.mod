// Wrapper module: CDI's CustomResourceDefinitions as CDI's operator installs
// them, from the generated copy in CDI's own module, at the CDI API version
// KubeVirt v1.8.4 builds against. cmd/cdi-crds prints them. The checksum
// database does not know this release, so `go mod tidy` here needs
// GONOSUMDB=kubevirt.io/containerized-data-importer; builds check go.sum.
module tenantry.dev/hack/upstream/cdi

go 1.26.1

require kubevirt.io/containerized-data-importer v1.64.0
