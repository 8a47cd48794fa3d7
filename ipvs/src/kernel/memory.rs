//! IPVS in memory, for tests of the real apply path without a kernel (feature
//! `memory-kernel`; never in a program). It follows the kernel's list rules
//! (`plan::Held::apply`) and fails a chosen write, or every read.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::Kernel;
use crate::Error;
use crate::model::{Dest, Service, ServiceKey, Stats};
use crate::plan::{Held, Op};

/// What the kernel holds: ringlb's services and also anyone else's (an
/// operator's, kube-proxy's), and the VIPs ringlb bound.
#[derive(Clone, Debug, Default)]
pub struct MemoryKernel {
    pub state: Held,
    /// Writes left before one fails (`None`: never); the failing one changes
    /// nothing.
    pub fail_after: Option<usize>,
    /// Writes made so far (the failed one not counted).
    pub writes: usize,
    /// Every read fails while set.
    pub fail_reads: bool,
    /// Every operation made, in order.
    pub log: Vec<Op>,
}

impl MemoryKernel {
    fn read(&self, what: &'static str) -> Result<(), Error> {
        if self.fail_reads {
            return Err(Error::Io {
                op: what,
                source: std::io::Error::other("injected read failure"),
            });
        }
        Ok(())
    }
}

impl Kernel for MemoryKernel {
    fn services(&mut self) -> Result<Vec<(Service, Stats)>, Error> {
        self.read("GET_SERVICE")?;
        Ok(self
            .state
            .services
            .values()
            .map(|h| (h.service.clone(), Stats::default()))
            .collect())
    }

    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<Dest>, Error> {
        self.read("GET_DEST")?;
        Ok(self
            .state
            .services
            .get(key)
            .map(|h| h.dests.clone())
            .unwrap_or_default())
    }

    fn vips(&mut self) -> Result<BTreeSet<IpAddr>, Error> {
        self.read("RTM_GETADDR")?;
        Ok(self.state.vips.clone())
    }

    fn write(&mut self, op: &Op) -> Result<(), Error> {
        let (verb, target) = op.describe();
        if let Some(left) = self.fail_after.as_mut() {
            if *left == 0 {
                return Err(Error::Io {
                    op: verb,
                    source: std::io::Error::other(format!("injected write failure: {target}")),
                });
            }
            *left -= 1;
        }
        self.state.apply(op).map_err(|errno| Error::Kernel {
            op: verb,
            target,
            errno,
        })?;
        self.writes += 1;
        self.log.push(op.clone());
        Ok(())
    }
}
