//! The real kernel: IPVS over generic netlink, VIPs on `lo` over rtnetlink.
//! Needs CAP_NET_ADMIN, and a kernel with `ip_vs` (and `ip_vs_mh` for the
//! scheduler; the kernel loads it on the first `mh` service if it can).

use std::collections::BTreeSet;
use std::net::IpAddr;

use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};

use super::Kernel;
use super::socket::Conn;
use crate::Error;
use crate::codec::consts::{GENL_ID_CTRL, IPVS_GENL_NAME, RTM_NEWADDR};
use crate::codec::ipvs::{DestAttr, Message, SvcAttr};
use crate::codec::{RawMsg, addr, ctrl};
use crate::model::{Dest, Service, ServiceKey, Stats};
use crate::plan::Op;

/// Generic netlink to IPVS plus rtnetlink, in the caller's network namespace.
pub struct NetlinkKernel {
    genl: Conn,
    rtnl: Conn,
    /// The IPVS family's message type.
    family: u16,
}

impl NetlinkKernel {
    /// Opens both sockets and resolves the IPVS family: a kernel without
    /// IPVS is [`Error::NoIpvs`], a clear start-up error.
    pub fn open() -> Result<Self, Error> {
        let mut genl = Conn::open(NETLINK_GENERIC, "generic netlink socket")?;
        let rtnl = Conn::open(NETLINK_ROUTE, "rtnetlink socket")?;
        let seq = genl.next_seq();
        let answer = genl.transact(
            "CTRL_CMD_GETFAMILY",
            &ctrl::get_family(IPVS_GENL_NAME, seq),
            seq,
        );
        let family = family_id(answer)?;
        tracing::debug!(family, "resolved the IPVS generic netlink family");
        Ok(NetlinkKernel { genl, rtnl, family })
    }

    fn ipvs(&mut self, op: &'static str, m: &Message) -> Result<Vec<Message>, Error> {
        let seq = self.genl.next_seq();
        let msgs = self.genl.transact(op, &m.encode(self.family, seq), seq)?;
        msgs.into_iter()
            .filter(|r| r.ty == self.family)
            .map(|r| Message::decode(&r.payload).map_err(|source| Error::Decode { op, source }))
            .collect()
    }
}

/// The IPVS family id from the answer to CTRL_CMD_GETFAMILY: no such family
/// (`-ENOENT`) means the kernel has no IPVS.
pub fn family_id(answer: Result<Vec<RawMsg>, Error>) -> Result<u16, Error> {
    let op = "CTRL_CMD_GETFAMILY";
    let msgs = match answer {
        Err(Error::Kernel { errno, .. }) if errno == -libc::ENOENT => return Err(Error::NoIpvs),
        r => r?,
    };
    for m in msgs.iter().filter(|m| m.ty == GENL_ID_CTRL) {
        let f = ctrl::Family::decode(&m.payload).map_err(|source| Error::Decode { op, source })?;
        if f.name == IPVS_GENL_NAME {
            return Ok(f.id);
        }
    }
    Err(Error::NoIpvs)
}

/// The error of a failed write, named after what it wrote. A `NEW_SERVICE`
/// refused with `-ENOENT` means its scheduler could not be found or loaded.
pub fn write_error(op: &Op, e: Error) -> Error {
    let (verb, target) = op.describe();
    match (op, e) {
        (Op::NewService(s) | Op::SetService(s), Error::Kernel { errno, .. })
            if errno == -libc::ENOENT =>
        {
            Error::NoScheduler {
                name: s.sched_name.clone(),
            }
        }
        (_, Error::Kernel { errno, .. }) => Error::Kernel {
            op: verb,
            target,
            errno,
        },
        (_, e) => e,
    }
}

impl Kernel for NetlinkKernel {
    fn services(&mut self) -> Result<Vec<(Service, Stats)>, Error> {
        let msgs = self.ipvs("IPVS_CMD_GET_SERVICE", &Message::get_services())?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m.service {
                Some(SvcAttr::Full(s)) => Some((s, m.stats.unwrap_or_default())),
                _ => None, // firewall-mark services
            })
            .collect())
    }

    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<Dest>, Error> {
        let msgs = self.ipvs("IPVS_CMD_GET_DEST", &Message::get_dests(*key))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m.dest {
                Some(DestAttr::Full(d)) => Some(d),
                _ => None,
            })
            .collect())
    }

    fn vips(&mut self) -> Result<BTreeSet<IpAddr>, Error> {
        let op = "RTM_GETADDR";
        let seq = self.rtnl.next_seq();
        let msgs = self.rtnl.transact(op, &addr::dump(seq), seq)?;
        let mut out = BTreeSet::new();
        for m in msgs.iter().filter(|m| m.ty == RTM_NEWADDR) {
            let a = addr::LocalAddr::decode(&m.payload)
                .map_err(|source| Error::Decode { op, source })?;
            if a.is_ringlb_vip() {
                out.insert(a.addr);
            }
        }
        Ok(out)
    }

    fn write(&mut self, op: &Op) -> Result<(), Error> {
        let (verb, _) = op.describe();
        let r = match op {
            Op::BindVip(a) | Op::UnbindVip(a) => {
                let seq = self.rtnl.next_seq();
                let req = match op {
                    Op::BindVip(_) => addr::add(*a, addr::LO_IFINDEX, seq),
                    _ => addr::del(*a, addr::LO_IFINDEX, seq),
                };
                self.rtnl.transact(verb, &req, seq).map(drop)
            }
            Op::NewService(s) => self.ipvs(verb, &Message::new_service(s.clone())).map(drop),
            Op::SetService(s) => self.ipvs(verb, &Message::set_service(s.clone())).map(drop),
            Op::DelService(k) => self.ipvs(verb, &Message::del_service(*k)).map(drop),
            Op::NewDest(k, d) => self.ipvs(verb, &Message::new_dest(*k, d.clone())).map(drop),
            Op::SetDest(k, d) => self.ipvs(verb, &Message::set_dest(*k, d.clone())).map(drop),
            Op::DelDest(k, d) => self.ipvs(verb, &Message::del_dest(*k, *d)).map(drop),
        };
        r.map_err(|e| write_error(op, e))
    }
}
