//! Every output frame of the benchmark is checked, not only its verdict and
//! length: an encapsulated frame must carry the next hop's MACs, a valid
//! outer IPv4 header from the edge's source to a backend of the packet's VIP,
//! and the client's packet unchanged behind it; a passed frame must be the
//! input; a restoring benchmark build must give the input back.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{bail, ensure};

use crate::setup::{SRC4, backend_addr};

/// Checks an encapsulated frame `out` made from `input` for VIP `vip`, whose
/// backends are `backend_addr(vip, 0..backends)`. Returns the backend.
pub(crate) fn encapped(
    input: &[u8],
    out: &[u8],
    vip: u32,
    backends: u32,
) -> anyhow::Result<Ipv4Addr> {
    let macs = ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]);
    ipip(input, out, macs, SRC4, vip, backends).map(|(_, backend)| backend)
}

/// Checks an IPIP frame `out` made from `input` by any balancer: `macs`
/// (destination, source), ethertype IPv4, an outer IPv4 header (IHL 5,
/// protocol 4, TTL 64, the total length, a valid checksum) from `src` to a
/// backend of VIP `vip` (`backend_addr(vip, 0..backends)`), and the client's
/// packet unchanged behind it. Returns the outer header and the backend.
pub(crate) fn ipip<'a>(
    input: &[u8],
    out: &'a [u8],
    macs: ([u8; 6], [u8; 6]),
    src: Ipv4Addr,
    vip: u32,
    backends: u32,
) -> anyhow::Result<(&'a [u8], Ipv4Addr)> {
    ensure!(
        out.len() == input.len() + 20,
        "length {} for input {}",
        out.len(),
        input.len()
    );
    ensure!(
        out[..6] == macs.0 && out[6..12] == macs.1,
        "next-hop MACs: {:02x?}",
        &out[..12]
    );
    ensure!(
        out[12..14] == [0x08, 0x00],
        "ethertype {:02x?}",
        &out[12..14]
    );
    let ip = &out[14..34];
    ensure!(
        ip[0] == 0x45 && ip[9] == 4 && ip[8] == 64,
        "outer header {ip:02x?}"
    );
    let inner_len = u16::from_be_bytes([input[16], input[17]]);
    ensure!(
        u16::from_be_bytes([ip[2], ip[3]]) == inner_len + 20,
        "outer total length"
    );
    ensure!(
        ringlb_testkit::packet::ipv4_checksum(ip) == 0,
        "outer checksum"
    );
    ensure!(ip[12..16] == src.octets(), "outer source {:?}", &ip[12..16]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let first = match backend_addr(vip, 0) {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(_) => bail!("v4 only"),
    };
    let off = u32::from(dst).wrapping_sub(first);
    ensure!(
        off < backends,
        "outer destination {dst} is no backend of VIP {vip}"
    );
    ensure!(out[34..] == input[14..], "inner packet changed");
    Ok((ip, dst))
}

/// A frame the program passed (or a restoring build gave back): the input.
pub(crate) fn unchanged(input: &[u8], out: &[u8]) -> anyhow::Result<()> {
    ensure!(out == input, "frame changed: {out:02x?}");
    Ok(())
}

/// The floor program's XDP_TX frame: the input with its MACs swapped.
pub(crate) fn macs_swapped(input: &[u8], out: &[u8]) -> anyhow::Result<()> {
    ensure!(
        out.len() == input.len()
            && out[..6] == input[6..12]
            && out[6..12] == input[..6]
            && out[12..] == input[12..],
        "floor output"
    );
    Ok(())
}
