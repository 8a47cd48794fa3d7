//! Whether the loader's view of the maps can be planned from.
//!
//! After a failed write the maps are somewhere between two states and the
//! loader re-reads them. If that re-read fails too, neither the view before
//! the plan nor the one after it is true: ids the plan deletes may still be
//! live (and, conntrack first, keep forwarding their flows), ids it writes may
//! be missing. The view is then *unknown*: nothing is planned from it until a
//! re-read succeeds. This module is the pure part of that rule; `xdp.rs` does
//! the reading.

use std::ops::Deref;

use super::Programmed;
use crate::Error;

/// The loader's view of the maps, known or not.
#[derive(Clone, Debug, Default)]
pub struct View {
    programmed: Programmed,
    /// Why the view is unknown (the failed write and the failed re-read).
    unknown: Option<String>,
}

impl From<Programmed> for View {
    fn from(programmed: Programmed) -> Self {
        Self {
            programmed,
            unknown: None,
        }
    }
}

/// The last view, for readers (dump, counters); it may be out of date while
/// [`View::is_known`] is false. Planning goes through [`View::plannable`].
impl Deref for View {
    type Target = Programmed;
    fn deref(&self) -> &Programmed {
        &self.programmed
    }
}

impl View {
    /// False after a failed write whose re-read failed too: re-read before
    /// planning.
    pub fn is_known(&self) -> bool {
        self.unknown.is_none()
    }

    /// The view to plan from, or a clear error while it is unknown.
    pub fn plannable(&mut self) -> Result<&mut Programmed, Error> {
        match &self.unknown {
            None => Ok(&mut self.programmed),
            Some(reason) => Err(Error::ViewUnknown {
                reason: reason.clone(),
            }),
        }
    }

    /// A plan's result once its writes all succeeded.
    pub fn set(&mut self, programmed: Programmed) {
        *self = programmed.into();
    }

    /// A re-read of the maps (before planning from an unknown view): on
    /// success the view is known again, on failure it stays unknown and the
    /// error says why.
    pub fn reread(&mut self, read: Result<Programmed, Error>) -> Result<(), Error> {
        match read {
            Ok(p) => {
                self.set(p);
                Ok(())
            }
            Err(e) => {
                let reason = format!("re-reading the maps failed: {e}");
                self.unknown = Some(reason.clone());
                Err(Error::ViewUnknown { reason })
            }
        }
    }

    /// A write failed (`error`); `read` is the re-read that follows. The view
    /// becomes what the maps hold, or unknown if they could not be read.
    pub fn write_failed(&mut self, error: &Error, read: Result<Programmed, Error>) {
        match read {
            Ok(p) => self.set(p),
            Err(e) => {
                tracing::error!(write = %error, reread = %e, "a map write failed and re-reading the maps failed too: nothing is planned until a re-read succeeds");
                self.unknown = Some(format!(
                    "a map write failed ({error}) and re-reading the maps failed ({e})"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DesiredState, ServiceEntry, Vip, plan, plan_update};
    use super::*;

    fn vip() -> Vip {
        Vip {
            addr: "10.0.0.1".parse().unwrap(),
            port: 80,
            proto: super::super::Proto::Tcp,
        }
    }
    fn entry(addrs: &[&str]) -> ServiceEntry {
        let b: Vec<_> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        let ring = (0..7).map(|s| (s % b.len()) as u32).collect();
        ServiceEntry::new(&vip(), b, ring).unwrap()
    }
    fn io_err() -> Error {
        Error::Syscall {
            call: "bpf(BPF_MAP_LOOKUP_ELEM)",
            source: std::io::Error::from_raw_os_error(12),
        }
    }

    /// The sequence `apply_service` goes through: plan (the view moves to the
    /// post-plan state), the write fails, the re-read fails. The post-plan
    /// view must not be planned from: it believes .2's id deleted, which the
    /// maps may still hold live.
    #[test]
    fn a_failed_write_and_a_failed_reread_block_planning_until_a_reread_succeeds() {
        let v = vip();
        let d = DesiredState {
            services: [(v, entry(&["10.1.0.1", "10.1.0.2"]))]
                .into_iter()
                .collect(),
        };
        let (_, maps) = plan(&Programmed::default(), &d).unwrap();
        let mut view = View::from(maps.clone());
        let p = view.plannable().unwrap();
        let ops = plan_update(p, &v, Some(&entry(&["10.1.0.1"]))).unwrap();
        assert!(!ops.is_empty());
        view.write_failed(&io_err(), Err(io_err()));
        assert!(!view.is_known());
        let e = view.plannable().unwrap_err();
        assert_eq!(e.metric_label(), "view_unknown");
        assert!(
            e.to_string().contains("re-reading the maps failed"),
            "a clear reason: {e}"
        );
        // a failing re-read keeps it unknown
        assert!(view.reread(Err(io_err())).is_err());
        assert!(view.plannable().is_err());
        // a successful one makes it known, with what the maps hold
        view.reread(Ok(maps.clone())).unwrap();
        assert_eq!(*view.plannable().unwrap(), maps);
        let p = view.plannable().unwrap();
        let ops = plan_update(p, &v, Some(&entry(&["10.1.0.1"]))).unwrap();
        assert!(
            ops.contains(&super::super::MapOp::DelBackend {
                id: maps.backend(&v, "10.1.0.2".parse().unwrap()).unwrap().id
            }),
            "planned from the maps' state: .2's id is deleted again {ops:?}"
        );
    }

    #[test]
    fn a_failed_write_with_a_good_reread_takes_the_maps_state() {
        let mut view = View::default();
        let maps = Programmed {
            last_generation: 42,
            ..Default::default()
        };
        view.write_failed(&io_err(), Ok(maps.clone()));
        assert!(view.is_known());
        assert_eq!(view.plannable().unwrap().last_generation, 42);
    }
}
