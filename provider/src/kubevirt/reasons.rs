//! Every condition reason the KubeVirt substrate reports, with how serious
//! each is: KubevirtCluster's and KubevirtMachine's (CAPK's names where
//! CAPK has one). Events, tests and metric labels read them from here.

use crate::reconciler::reasons::reasons;

reasons! {
    // KubevirtCluster (`InfraClusterUnavailable` and `Provisioned` serve
    // both kinds).
    WaitingForOwnerCluster = "WaitingForOwnerCluster", Progress;
    InfraClusterUnavailable = "InfraClusterUnavailable", Failure;
    WaitingForLoadBalancer = "WaitingForLoadBalancer", Progress;
    LoadBalancerAvailable = "LoadBalancerAvailable", Progress;
    Provisioned = "Provisioned", Progress;
    // KubevirtMachine, on `VMProvisioned`, `BootstrapExecSucceeded` and
    // `Ready`.
    WaitingForOwnerMachine = "WaitingForOwnerMachine", Progress;
    WaitingForCluster = "WaitingForCluster", Progress;
    WaitingForClusterInfrastructure = "WaitingForClusterInfrastructure", Progress;
    WaitingForControlPlane = "WaitingForControlPlaneInitialized", Progress;
    WaitingForBootstrapData = "WaitingForBootstrapData", Progress;
    BootstrapDataSecretMissing = "BootstrapDataSecretNotFound", Failure;
    /// A request to the infrastructure cluster failed; retried with backoff.
    InfraClusterApiError = "InfraClusterAPIError", Progress;
    InvalidSpec = "InvalidSpec", Failure;
    VmCreateFailed = "VMCreateFailed", Failure;
    WaitingForVm = "WaitingForVirtualMachine", Progress;
    DataVolumeImporting = "DataVolumeImporting", Progress;
    DataVolumeImportFailed = "DataVolumeImportFailed", Failure;
    WaitingForVmi = "WaitingForVirtualMachineInstance", Progress;
    VmStopped = "VMStopped", Progress;
    VmStartFailing = "VMStartFailing", Failure;
    Unschedulable = "Unschedulable", Failure;
    ImagePullFailed = "ImagePullFailed", Failure;
    VmiFailed = "VMIFailed", Failure;
    VmiEvicted = "VMIEvicted", Failure;
    VmNotReady = "VMNotReady", Progress;
    VmTerminal = "VMTerminal", Failure;
    Deleting = "Deleting", Progress;
    BootstrapCheckDisabled = "BootstrapCheckDisabled", Progress;
    BootstrapCheckNotSupported = "BootstrapCheckingNotSupported", Progress;
    WaitingForSshKeys = "WaitingForSSHKeys", Progress;
    SshKeysInvalid = "SSHKeysInvalid", Failure;
    InvalidBootstrapData = "InvalidBootstrapData", Failure;
    WaitingForIpAddress = "WaitingForIPAddress", Progress;
    WaitingForBootstrapSentinel = "WaitingForBootstrapSentinel", Progress;
    BootstrapSentinelUnexpected = "BootstrapSentinelUnexpected", Failure;
    SshConnectionFailed = "SSHConnectionFailed", Progress;
    SshAuthenticationFailed = "SSHAuthenticationFailed", Progress;
    BootstrapSentinelFound = "BootstrapSentinelFound", Progress;
}
