//! Every condition reason the tenant controllers report, with how serious
//! each is: a `Kubernetes` object's and a `KubernetesNodes` pool's.

use crate::reconciler::reasons::reasons;

reasons! {
    // Kubernetes (`Ready` and `ApplyFailed` serve both kinds).
    EtcdAvailable = "EtcdAvailable", Progress;
    EtcdNotAvailable = "EtcdNotAvailable", Failure;
    EtcdProvisioning = "EtcdProvisioning", Progress;
    ControlPlaneReady = "ControlPlaneReady", Progress;
    WaitingForEtcd = "WaitingForEtcd", Progress;
    ControlPlaneProvisioning = "ControlPlaneProvisioning", Progress;
    ControlPlaneUpgrading = "ControlPlaneUpgrading", Progress;
    ControlPlaneFailed = "ControlPlaneFailed", Failure;
    KubeconfigMissing = "AdminKubeconfigMissing", Progress;
    Ready = "Ready", Progress;
    ApplyFailed = "ApplyFailed", Failure;
    // KubernetesNodes.
    ClusterNotFound = "ClusterNotFound", Failure;
    ClusterDeleting = "ClusterDeleting", Progress;
    WaitingForControlPlane = "WaitingForControlPlane", Progress;
    TenantUnreachable = "TenantUnreachable", Failure;
    Scaling = "Scaling", Progress;
    RollingOut = "RollingOut", Progress;
    WorkersNotReady = "WorkersNotReady", Progress;
    WorkersReady = "WorkersReady", Progress;
    NoWorkersWanted = "NoWorkersWanted", Progress;
}
