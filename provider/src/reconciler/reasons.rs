//! Condition reasons as one enum per substrate (KubeVirt, Proxmox VE, the
//! tenant controllers, remediation): each reason's text (also its metric
//! label) and [`Severity`] are declared together, so what counts as a
//! failure is never a list kept apart from the reasons.

/// How a reason reads to an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// On the way, or waiting for something that comes by itself.
    Progress,
    /// Someone must act (or a system refused): a Warning event when an
    /// object first reports it.
    Failure,
}

/// Declares `pub enum Reason` with `ALL`, `as_str`, `severity`, `parse`,
/// `is_failure` and `Display`: `Variant = "Text", Severity;` per reason.
macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal, $severity:ident; )*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $( $(#[$doc])* $variant, )*
        }

        impl Reason {
            pub const ALL: &[Reason] = &[$(Reason::$variant),*];

            /// The condition reason, also the metric label.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $text,)*
                }
            }

            pub fn severity(self) -> $crate::reconciler::reasons::Severity {
                match self {
                    $(Reason::$variant => $crate::reconciler::reasons::Severity::$severity,)*
                }
            }

            /// The reason a condition carries, if it is one of these.
            pub fn parse(text: &str) -> Option<Reason> {
                Reason::ALL.iter().copied().find(|r| r.as_str() == text)
            }

            pub fn is_failure(self) -> bool {
                self.severity() == $crate::reconciler::reasons::Severity::Failure
            }
        }

        impl std::fmt::Display for Reason {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use reasons;
