//! Faults on demand: from Rust through [`Faults`], or through the
//! annotations in [`super::annotations`]. Both end up in the same resolved
//! view that the simulated components consult on every reconcile, so a fault
//! can be switched on and off while objects exist.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use kube::api::DynamicObject;
use tokio::sync::watch;

use super::annotations as keys;
use super::resources::{annotation, parse_duration};

/// A fault the simulator injects into the objects a [`FaultTarget`] matches.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// See [`keys::UNSCHEDULABLE`]; `None` uses a default scheduler message.
    Unschedulable(Option<String>),
    /// See [`keys::FAIL_AT_START`].
    FailAtStart,
    /// See [`keys::IMAGE_PULL_ERROR`]; `None` uses a default message.
    ImagePullError(Option<String>),
    /// See [`keys::HUNG_GUEST`].
    HungGuest,
    /// See [`keys::IMPORT_ERROR`].
    ImportError(String),
    /// See [`keys::IMPORT_FATAL`].
    ImportFatal(String),
    /// See [`keys::IMPORT_DURATION`].
    SlowImport(Duration),
    /// See [`keys::BOOTSTRAP_SENTINEL_ABSENT`] (SSH guests only).
    BootstrapSentinelAbsent,
    /// See [`keys::BOOTSTRAP_SENTINEL`] (SSH guests only).
    BootstrapSentinel(String),
    /// See [`keys::BOOTSTRAP_DURATION`] (SSH guests only).
    SlowBootstrap(Duration),
    /// See [`keys::SHUTDOWN_GRACE`]: the guest takes this long to shut down
    /// once its VMI is deleted (clear the fault to let it finish).
    SlowShutdown(Duration),
}

/// Which objects a fault applies to: VMI faults match the VirtualMachine's
/// name (its VMI has the same name), import faults the DataVolume's name.
/// `None` matches any.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultTarget {
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl FaultTarget {
    /// Every object.
    pub fn any() -> Self {
        Self::default()
    }

    /// One object by namespace and name.
    pub fn named(namespace: &str, name: &str) -> Self {
        Self {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
        }
    }

    /// Every object in a namespace.
    pub fn in_namespace(namespace: &str) -> Self {
        Self {
            namespace: Some(namespace.into()),
            name: None,
        }
    }

    fn matches(&self, namespace: &str, name: &str) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
            && self.name.as_deref().is_none_or(|n| n == name)
    }
}

/// Identifies an injected fault, to clear it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultId(u64);

/// The faults injected from Rust. Changes wake every simulated component, so
/// they apply to existing objects right away.
#[derive(Clone)]
pub struct Faults {
    rules: Arc<Mutex<Vec<(FaultId, FaultTarget, Fault)>>>,
    next_id: Arc<AtomicU64>,
    changed: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rules: Arc::default(),
            next_id: Arc::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.rules().iter()).finish()
    }
}

impl Faults {
    /// Injects `fault` into the objects `target` matches, until cleared.
    pub fn inject(&self, target: FaultTarget, fault: Fault) -> FaultId {
        let id = FaultId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.rules
            .lock()
            .expect("fault rules lock")
            .push((id, target, fault));
        self.notify();
        id
    }

    /// Removes one injected fault.
    pub fn clear(&self, id: FaultId) {
        self.rules
            .lock()
            .expect("fault rules lock")
            .retain(|(rule, _, _)| *rule != id);
        self.notify();
    }

    /// Removes every fault injected from Rust (annotations stay).
    pub fn clear_all(&self) {
        self.rules.lock().expect("fault rules lock").clear();
        self.notify();
    }

    fn rules(&self) -> Vec<(FaultId, FaultTarget, Fault)> {
        self.rules.lock().expect("fault rules lock").clone()
    }

    fn matching(&self, namespace: &str, name: &str) -> Vec<Fault> {
        self.rules()
            .into_iter()
            .filter(|(_, target, _)| target.matches(namespace, name))
            .map(|(_, _, fault)| fault)
            .collect()
    }

    fn notify(&self) {
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// Fires once per change of the injected faults.
    pub(super) fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let receiver = self.changed.subscribe();
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.changed().await.ok()?;
            Some(((), receiver))
        })
    }

    /// The faults that apply to a VMI, from its own annotations, its VM's
    /// and the Rust rules for the VM's name.
    pub(super) fn for_vmi(&self, vmi: &DynamicObject, vm: Option<&DynamicObject>) -> VmiFaults {
        let mut faults = VmiFaults::default();
        for object in std::iter::once(vmi).chain(vm) {
            if let Some(message) = annotation(object, keys::UNSCHEDULABLE) {
                faults.unschedulable.get_or_insert(non_empty(message));
            }
            if annotation(object, keys::FAIL_AT_START).is_some() {
                faults.fail_at_start = true;
            }
            if let Some(message) = annotation(object, keys::IMAGE_PULL_ERROR) {
                faults.image_pull.get_or_insert(non_empty(message));
            }
            if annotation(object, keys::HUNG_GUEST).is_some() {
                faults.hung_guest = true;
            }
            if let Some(grace) = annotation(object, keys::SHUTDOWN_GRACE).and_then(parse_duration) {
                faults.shutdown_grace.get_or_insert(grace);
            }
            if annotation(object, keys::BOOTSTRAP_SENTINEL_ABSENT).is_some() {
                faults.sentinel_absent = true;
            }
            if let Some(content) = annotation(object, keys::BOOTSTRAP_SENTINEL) {
                faults.sentinel.get_or_insert_with(|| content.to_string());
            }
            if let Some(duration) =
                annotation(object, keys::BOOTSTRAP_DURATION).and_then(parse_duration)
            {
                faults.bootstrap_duration.get_or_insert(duration);
            }
        }
        let namespace = vmi.metadata.namespace.as_deref().unwrap_or("default");
        let name = vmi.metadata.name.as_deref().unwrap_or_default();
        for fault in self.matching(namespace, name) {
            match fault {
                Fault::Unschedulable(message) => {
                    faults.unschedulable.get_or_insert(message);
                }
                Fault::FailAtStart => faults.fail_at_start = true,
                Fault::ImagePullError(message) => {
                    faults.image_pull.get_or_insert(message);
                }
                Fault::HungGuest => faults.hung_guest = true,
                Fault::BootstrapSentinelAbsent => faults.sentinel_absent = true,
                Fault::BootstrapSentinel(content) => {
                    faults.sentinel.get_or_insert(content);
                }
                Fault::SlowBootstrap(duration) => {
                    faults.bootstrap_duration.get_or_insert(duration);
                }
                Fault::SlowShutdown(grace) => {
                    faults.shutdown_grace.get_or_insert(grace);
                }
                Fault::ImportError(_) | Fault::ImportFatal(_) | Fault::SlowImport(_) => {}
            }
        }
        faults
    }

    /// The faults that apply to a DataVolume's import, from its own
    /// annotations, its VM's and the Rust rules for the DataVolume's name.
    pub(super) fn for_import(
        &self,
        dv: &DynamicObject,
        vm: Option<&DynamicObject>,
    ) -> ImportFaults {
        let mut faults = ImportFaults::default();
        for object in std::iter::once(dv).chain(vm) {
            if let Some(message) = annotation(object, keys::IMPORT_FATAL) {
                faults
                    .fatal
                    .get_or_insert_with(|| or_default(message, "import failed"));
            }
            if let Some(message) = annotation(object, keys::IMPORT_ERROR) {
                faults
                    .error
                    .get_or_insert_with(|| or_default(message, "import failed"));
            }
            if let Some(duration) =
                annotation(object, keys::IMPORT_DURATION).and_then(parse_duration)
            {
                faults.min_duration.get_or_insert(duration);
            }
        }
        let namespace = dv.metadata.namespace.as_deref().unwrap_or("default");
        let name = dv.metadata.name.as_deref().unwrap_or_default();
        for fault in self.matching(namespace, name) {
            match fault {
                Fault::ImportError(message) => {
                    faults.error.get_or_insert(message);
                }
                Fault::ImportFatal(message) => {
                    faults.fatal.get_or_insert(message);
                }
                Fault::SlowImport(duration) => {
                    faults.min_duration.get_or_insert(duration);
                }
                Fault::Unschedulable(_)
                | Fault::FailAtStart
                | Fault::ImagePullError(_)
                | Fault::HungGuest
                | Fault::BootstrapSentinelAbsent
                | Fault::BootstrapSentinel(_)
                | Fault::SlowBootstrap(_)
                | Fault::SlowShutdown(_) => {}
            }
        }
        faults
    }
}

fn non_empty(message: &str) -> Option<String> {
    (!message.trim().is_empty()).then(|| message.to_string())
}

fn or_default(message: &str, default: &str) -> String {
    non_empty(message).unwrap_or_else(|| default.to_string())
}

/// The VMI faults in force for one VMI.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct VmiFaults {
    /// `Some(None)`: unschedulable with the default message.
    pub unschedulable: Option<Option<String>>,
    pub fail_at_start: bool,
    pub image_pull: Option<Option<String>>,
    pub hung_guest: bool,
    pub shutdown_grace: Option<Duration>,
    /// The guest's bootstrap never writes CAPI's sentinel file.
    pub sentinel_absent: bool,
    /// The guest's bootstrap writes this instead of `success`.
    pub sentinel: Option<String>,
    /// How long the guest's bootstrap takes.
    pub bootstrap_duration: Option<Duration>,
}

/// The import faults in force for one DataVolume.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ImportFaults {
    pub error: Option<String>,
    pub fatal: Option<String>,
    pub min_duration: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, annotations: &[(&str, &str)]) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "annotations": annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            },
        }))
        .expect("object")
    }

    #[test]
    fn annotations_and_rules_resolve_together() {
        let faults = Faults::default();
        let vmi = object("vm-a", &[(keys::HUNG_GUEST, "")]);
        let vm = object("vm-a", &[(keys::UNSCHEDULABLE, "")]);
        let resolved = faults.for_vmi(&vmi, Some(&vm));
        assert!(resolved.hung_guest);
        assert_eq!(resolved.unschedulable, Some(None));
        assert!(!resolved.fail_at_start);

        let id = faults.inject(FaultTarget::named("ns", "vm-a"), Fault::FailAtStart);
        faults.inject(
            FaultTarget::named("ns", "other"),
            Fault::ImagePullError(None),
        );
        let resolved = faults.for_vmi(&vmi, None);
        assert!(resolved.fail_at_start);
        assert_eq!(resolved.image_pull, None);
        faults.clear(id);
        assert!(!faults.for_vmi(&vmi, None).fail_at_start);
    }

    #[test]
    fn bootstrap_faults_resolve_from_annotations_and_rules() {
        let faults = Faults::default();
        let vm = object(
            "vm-b",
            &[
                (keys::BOOTSTRAP_SENTINEL, "failed"),
                (keys::BOOTSTRAP_DURATION, "2s"),
            ],
        );
        let resolved = faults.for_vmi(&object("vm-b", &[]), Some(&vm));
        assert_eq!(resolved.sentinel.as_deref(), Some("failed"));
        assert_eq!(resolved.bootstrap_duration, Some(Duration::from_secs(2)));
        assert!(!resolved.sentinel_absent);
        faults.inject(
            FaultTarget::named("ns", "vm-b"),
            Fault::BootstrapSentinelAbsent,
        );
        assert!(faults.for_vmi(&object("vm-b", &[]), None).sentinel_absent);
    }

    #[test]
    fn import_faults_take_messages_and_durations() {
        let faults = Faults::default();
        let dv = object(
            "dv",
            &[
                (keys::IMPORT_ERROR, "disk on fire"),
                (keys::IMPORT_DURATION, "3s"),
            ],
        );
        let resolved = faults.for_import(&dv, None);
        assert_eq!(resolved.error.as_deref(), Some("disk on fire"));
        assert_eq!(resolved.min_duration, Some(Duration::from_secs(3)));
        faults.inject(FaultTarget::any(), Fault::ImportFatal("bad".into()));
        assert_eq!(faults.for_import(&dv, None).fatal.as_deref(), Some("bad"));
    }
}
