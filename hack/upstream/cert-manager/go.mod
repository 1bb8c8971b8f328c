// Wrapper module: pins cert-manager for its CRDs only (deploy/crds, which
// cert-manager keeps "for reference, development and testing"); nothing is
// built from it. The version is clusterctl v1.14's CertManagerDefaultVersion
// (cmd/clusterctl/client/config/cert_manager_client.go), the cert-manager a
// real `clusterctl init` would install.
module tenantry.dev/hack/upstream/cert-manager

go 1.26.0

require github.com/cert-manager/cert-manager v1.21.1
