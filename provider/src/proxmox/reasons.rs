//! Every condition reason the Proxmox VE substrate reports, with how
//! serious each is: ProxmoxCluster's and ProxmoxMachine's (capmox's names
//! where capmox has one). Events, tests and metric labels read them from
//! here.

use crate::reconciler::reasons::reasons;

reasons! {
    // ProxmoxCluster (`Provisioned` and `Deleting` serve both kinds).
    WaitingForOwnerCluster = "WaitingForOwnerCluster", Progress;
    InvalidAddressPool = "InvalidAddressPool", Failure;
    WaitingForEndpoint = "WaitingForControlPlaneEndpoint", Progress;
    /// `ProxmoxAvailable`: the PVE API answers with the credentials.
    Available = "Available", Progress;
    AllPrivilegesHeld = "AllPrivilegesHeld", Progress;
    /// `PrivilegesSufficient` False; warned of through its condition type.
    MissingPrivileges = "MissingPrivileges", Failure;
    Scoped = "ScopedToTenant", Progress;
    /// `TokenScoped` False: a warning, not a failure of the cluster.
    ReachesEveryVm = "TokenReachesEveryVM", Progress;
    Provisioned = "Provisioned", Progress;
    Deleting = "Deleting", Progress;
    // ProxmoxMachine, on `VirtualMachineProvisioned` and `Ready`, in the
    // order a machine meets them.
    WaitingForOwnerMachine = "WaitingForOwnerMachine", Progress;
    WaitingForCluster = "WaitingForCluster", Progress;
    WaitingForClusterInfrastructure = "WaitingForClusterInfrastructure", Progress;
    WaitingForControlPlane = "WaitingForControlPlaneInitialized", Progress;
    WaitingForBootstrapData = "WaitingForBootstrapData", Progress;
    BootstrapDataSecretMissing = "BootstrapDataSecretNotFound", Failure;
    ProxmoxClusterNotFound = "ProxmoxClusterNotFound", Failure;
    // The ProxmoxCluster's credentials and client settings.
    CredentialsRefInvalid = "CredentialsRefInvalid", Failure;
    CredentialsSecretNotFound = "CredentialsSecretNotFound", Failure;
    CredentialsInvalid = "CredentialsInvalid", Failure;
    CredentialsUnreadable = "CredentialsUnreadable", Failure;
    InvalidUrl = "InvalidURL", Failure;
    InvalidCredentials = "InvalidCredentials", Failure;
    InvalidCertificateAuthority = "InvalidCertificateAuthority", Failure;
    ClientSetupFailed = "ClientSetupFailed", Failure;
    // What PVE refused, named after PVE's answer.
    Unauthorized = "Unauthorized", Failure;
    PermissionDenied = "PermissionDenied", Failure;
    TlsHandshakeFailed = "TLSHandshakeFailed", Failure;
    InvalidSpec = "InvalidSpec", Failure;
    TemplateNotFound = "TemplateNotFound", Failure;
    NodeCapacityUnknown = "NodeCapacityUnknown", Failure;
    InsufficientResources = "InsufficientResources", Failure;
    NoNodeAvailable = "NoNodeAvailable", Failure;
    VmidRangeExhausted = "VMIDRangeExhausted", Failure;
    StorageOutsidePool = "StorageOutsidePool", Failure;
    /// The PVE API did not answer, or answered "busy": retried with backoff.
    ProxmoxUnavailable = "ProxmoxUnavailable", Progress;
    /// PVE refused a request no step names a reason for: retried with backoff.
    ProxmoxRequestFailed = "ProxmoxRequestFailed", Failure;
    /// Ready to provision; waiting for one of the manager's reconciles.
    WaitingForTurn = "WaitingForProvisioningTurn", Progress;
    Cloning = "Cloning", Progress;
    CloningFailed = "CloningFailed", Failure;
    VmOutsidePool = "VMOutsidePool", Failure;
    VmNotOwned = "VMNotOwned", Failure;
    VmNotFound = "VMNotFound", Failure;
    VmLocked = "VMLocked", Progress;
    Configuring = "WaitingForVMConfiguration", Progress;
    ConfigurationFailed = "VMConfigurationFailed", Failure;
    ResizingDisk = "WaitingForDiskReconciliation", Progress;
    DiskResizeFailed = "DiskResizeFailed", Failure;
    WaitingForStaticIp = "WaitingForStaticIPAllocation", Progress;
    IpAllocationFailed = "IPAddressClaimFailed", Failure;
    IpAddressConflict = "IPAddressConflict", Failure;
    UploadingBootstrapData = "WaitingForBootstrapDataReconciliation", Progress;
    BootstrapDataFailed = "BootstrapDataReconciliationFailed", Failure;
    PoweringOn = "WaitingForVMPowerUp", Progress;
    PoweringOnFailed = "PoweringOnFailed", Failure;
    WaitingForGuestAgent = "WaitingForGuestAgent", Progress;
    WaitingForGuestAddresses = "WaitingForGuestAddresses", Progress;
    GuestAgentNotConfigured = "GuestAgentNotConfigured", Failure;
    VmNotRunning = "VMNotRunning", Failure;
    DeletionFailed = "DeletionFailed", Failure;
    TaskFailed = "TaskFailed", Failure;
}
