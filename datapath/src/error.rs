//! The seam's error: whatever a datapath failed with, with the short label the
//! agent logs and counts (`ringlb_*_apply_errors_total{kind}`). Each datapath
//! converts its own typed error into it (`From<ringlb_xdp::Error>`,
//! `From<ringlb_ipvs::Error>`), keeping that error as the source, so the label and
//! the message are the datapath's own and a caller can still downcast.

use std::error::Error as StdError;
use std::fmt;

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// A datapath's error behind the seam. It displays as the datapath's error and
/// is as transparent: `source()` is that error's source.
pub struct Error {
    label: &'static str,
    inner: Source,
}

impl Error {
    /// Wraps a datapath's error under `label` (its `metric_label()`).
    pub fn new(label: &'static str, inner: impl Into<Source>) -> Self {
        Self {
            label,
            inner: inner.into(),
        }
    }

    /// A service the seam's own checks refused (`ServiceEntry::new`).
    pub fn invalid_service(vip: impl ToString, reason: impl Into<String>) -> Self {
        Self::new(
            "invalid_service",
            InvalidService {
                vip: vip.to_string(),
                reason: reason.into(),
            },
        )
    }

    /// Short, stable label for the `apply_errors_total{kind}` metric: the
    /// datapath's own `metric_label()`.
    pub fn metric_label(&self) -> &'static str {
        self.label
    }

    /// The datapath's error.
    pub fn get_ref(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.inner
    }

    /// The datapath's error, if it is an `E`.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.inner.downcast_ref::<E>()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("label", &self.label)
            .field("inner", &self.inner)
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner.source()
    }
}

/// A service the seam refuses before any datapath sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service {vip}: {reason}")]
pub struct InvalidService {
    pub vip: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn displays_and_chains_as_the_datapath_error() {
        let e = Error::new("syscall", Outer(std::io::Error::other("inner")));
        assert_eq!(e.to_string(), "outer");
        assert_eq!(e.metric_label(), "syscall");
        assert_eq!(e.source().unwrap().to_string(), "inner");
        assert!(e.downcast_ref::<Outer>().is_some());
        let e = Error::invalid_service("10.0.0.1:80/tcp", "no backends");
        assert_eq!(e.to_string(), "service 10.0.0.1:80/tcp: no backends");
        assert_eq!(e.metric_label(), "invalid_service");
    }
}
