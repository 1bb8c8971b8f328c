//! Every CRD tenantry serves, generated from the Rust types. `config/crd/`
//! holds their YAML (`tenantry crds --out config/crd/bases`), and a test keeps
//! it in step with the types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

use crate::kubevirt::{
    KubevirtCluster, KubevirtClusterTemplate, KubevirtMachine, KubevirtMachineTemplate,
};
use crate::proxmox::{
    ProxmoxCluster, ProxmoxClusterTemplate, ProxmoxMachine, ProxmoxMachineTemplate,
};
use crate::remediation::{
    KubevirtRemediation, KubevirtRemediationTemplate, ProxmoxRemediation,
    ProxmoxRemediationTemplate,
};
use crate::tenant::Kubernetes;
use crate::tenant_nodes::KubernetesNodes;

/// All of tenantry's CRDs, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    let crds = vec![
        spec_optional(KubevirtCluster::crd()),
        KubevirtClusterTemplate::crd(),
        spec_optional(KubevirtMachine::crd()),
        KubevirtMachineTemplate::crd(),
        // capmox's CRDs require `spec`, so the derived schema is already right.
        ProxmoxCluster::crd(),
        ProxmoxClusterTemplate::crd(),
        ProxmoxMachine::crd(),
        ProxmoxMachineTemplate::crd(),
        // CAPI creates remediations from `spec.template` of the template,
        // which may hold no spec at all.
        spec_optional(KubevirtRemediation::crd()),
        KubevirtRemediationTemplate::crd(),
        spec_optional(ProxmoxRemediation::crd()),
        ProxmoxRemediationTemplate::crd(),
        // Every spec field has a default, so `spec: {}` is a whole cluster.
        spec_optional(Kubernetes::crd()),
        // A pool must name its cluster, so its spec is required.
        KubernetesNodes::crd(),
    ];
    crds.into_iter().map(free_form_objects_preserved).collect()
}

/// kopium types free-form objects (the embedded ObjectMeta of KubeVirt's
/// `spec.template` and `dataVolumeTemplates[]`, for one) as maps, which
/// schemars renders `additionalProperties: true`. A structural schema does not
/// keep unknown fields for that: the apiserver prunes them (labels and
/// annotations a platform puts on the VMI or the DataVolume) and warns. CAPK's
/// CRDs mark those objects `x-kubernetes-preserve-unknown-fields`, and so do we.
fn free_form_objects_preserved(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            preserve_free_form(schema);
        }
    }
    crd
}

fn preserve_free_form(schema: &mut JSONSchemaProps) {
    if matches!(
        schema.additional_properties,
        Some(JSONSchemaPropsOrBool::Bool(true))
    ) {
        schema.additional_properties = None;
        schema.x_kubernetes_preserve_unknown_fields = Some(true);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(inner)) = schema.additional_properties.as_mut() {
        preserve_free_form(inner);
    }
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        preserve_free_form(child);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(inner)) => preserve_free_form(inner),
        Some(JSONSchemaPropsOrArray::Schemas(list)) => list.iter_mut().for_each(preserve_free_form),
        None => {}
    }
    for list in [&mut schema.all_of, &mut schema.any_of, &mut schema.one_of] {
        list.iter_mut().flatten().for_each(preserve_free_form);
    }
    if let Some(not) = schema.not.as_mut() {
        preserve_free_form(not);
    }
}

/// CAPK's CRDs do not require `spec`, and its templates create
/// KubevirtClusters without one. The apiserver fills in `spec: {}` instead,
/// so every stored object still has the spec our types expect.
fn spec_optional(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = schema.required.as_mut() {
            required.retain(|field| field != "spec");
            if required.is_empty() {
                schema.required = None;
            }
        }
        if let Some(spec) = schema.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            spec.default = Some(JSON(serde_json::json!({})));
        }
    }
    crd
}
