//! A driver's own statistics (`ethtool -S`), read with the `SIOCETHTOOL` ioctl
//! (`ETHTOOL_GDRVINFO`, `ETHTOOL_GSTRINGS`, `ETHTOOL_GSTATS`), for the XDP
//! transmit errors that no other counter shows.
//!
//! An `XDP_TX` or a redirect the driver cannot send is dropped by the driver and
//! counted only there: veth counts `rx_queue_N_xdp_tx_errors` (native `XDP_TX` on a
//! veth whose peer runs no XDP program) and `tx_queue_N_xdp_xmit_errors`, mlx5
//! `rx_xdp_tx_err` and `tx_xdp_err`, others alike. The program's own `tx` and
//! `redirect` counters count the packet as sent. [`xdp_tx_errors`] sums the
//! counters whose names say so.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
const ETHTOOL_GSTRINGS: u32 = 0x0000_001b;
const ETHTOOL_GSTATS: u32 = 0x0000_001d;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;
/// No driver has more (mlx5 has a few thousand with many queues).
const MAX_STATS: u32 = 1 << 16;

/// `struct ethtool_drvinfo`
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}
const _: () = assert!(size_of::<DrvInfo>() == 196);

/// `struct ifreq` with `ifr_data`
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// One interface's driver name and statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    pub driver: String,
    pub stats: Vec<(String, u64)>,
}

/// The driver name and `ethtool -S` statistics of `iface`, in the calling
/// thread's network namespace.
pub fn driver_stats(iface: &str) -> io::Result<DriverStats> {
    let name = CString::new(iface).map_err(io::Error::other)?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!(
            "{iface:?}: interface name too long"
        )));
    }
    let sock = socket()?;
    let mut info: DrvInfo = zeroed_drvinfo();
    info.cmd = ETHTOOL_GDRVINFO;
    ioctl(&sock, &name, (&raw mut info).cast())?;
    let n = info.n_stats.min(MAX_STATS);
    let driver = c_str(&info.driver);
    if n == 0 {
        return Ok(DriverStats {
            driver,
            stats: Vec::new(),
        });
    }
    // ethtool_gstrings: cmd, string_set, len, then len * 32 bytes
    let mut strings = vec![0u8; 12 + n as usize * ETH_GSTRING_LEN];
    strings[0..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
    strings[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
    strings[8..12].copy_from_slice(&n.to_ne_bytes());
    ioctl(&sock, &name, strings.as_mut_ptr().cast())?;
    // ethtool_stats: cmd, n_stats, then n_stats u64 (8-aligned: a u64 buffer)
    let mut values = vec![0u64; 1 + n as usize];
    let head = (u64::from(n) << 32) | u64::from(ETHTOOL_GSTATS);
    values[0] = if cfg!(target_endian = "little") {
        head
    } else {
        (u64::from(ETHTOOL_GSTATS) << 32) | u64::from(n)
    };
    ioctl(&sock, &name, values.as_mut_ptr().cast())?;
    let got = u32::from_ne_bytes(strings[8..12].try_into().unwrap_or_default()).min(n);
    let stats = (0..got as usize)
        .map(|i| {
            let s = &strings[12 + i * ETH_GSTRING_LEN..12 + (i + 1) * ETH_GSTRING_LEN];
            (c_str(s), values[1 + i])
        })
        .collect();
    Ok(DriverStats { driver, stats })
}

/// Whether a driver statistic counts XDP transmits the driver failed (veth
/// `*_xdp_tx_errors`, `*_xdp_xmit_errors`; mlx5 `rx_xdp_tx_err`, `tx_xdp_err`).
pub fn is_xdp_tx_error(name: &str) -> bool {
    name.contains("xdp") && name.contains("err") && (name.contains("tx") || name.contains("xmit"))
}

/// The sum of the XDP transmit error counters, or `None` when the driver has
/// none (then failures cannot be seen this way).
pub fn xdp_tx_errors(stats: &[(String, u64)]) -> Option<u64> {
    let mut it = stats.iter().filter(|(n, _)| is_xdp_tx_error(n)).peekable();
    it.peek()?;
    Some(it.fold(0u64, |a, (_, v)| a.saturating_add(*v)))
}

fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn zeroed_drvinfo() -> DrvInfo {
    DrvInfo {
        cmd: 0,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    }
}

// socket(2) and ioctl(2) through libc: the ethtool ioctl has no safe wrapper in
// the workspace's dependencies.
#[allow(unsafe_code)]
fn socket() -> io::Result<OwnedFd> {
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket(2) just returned, owned by nobody else
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[allow(unsafe_code)]
fn ioctl(sock: &OwnedFd, name: &CString, data: *mut libc::c_void) -> io::Result<()> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    req.name[..name.as_bytes().len()].copy_from_slice(name.as_bytes());
    // SAFETY: `req` names a buffer the caller sized for the command in it
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &raw mut req) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(n, x)| (n.to_string(), *x)).collect()
    }

    #[test]
    fn the_tx_error_counters_of_veth_and_mlx5_are_summed_and_others_not() {
        let veth = s(&[
            ("peer_ifindex", 7),
            ("rx_queue_0_xdp_packets", 100),
            ("rx_queue_0_xdp_tx", 40),
            ("rx_queue_0_xdp_tx_errors", 40),
            ("rx_queue_1_xdp_tx_errors", 2),
            ("tx_queue_0_xdp_xmit", 5),
            ("tx_queue_0_xdp_xmit_errors", 1),
            ("rx_queue_0_drops", 9),
        ]);
        assert_eq!(xdp_tx_errors(&veth), Some(43));
        let mlx5 = s(&[
            ("rx_xdp_tx_xmit", 10),
            ("rx_xdp_tx_err", 3),
            ("tx_xdp_err", 4),
        ]);
        assert_eq!(xdp_tx_errors(&mlx5), Some(7));
        assert_eq!(
            xdp_tx_errors(&s(&[("rx_errors", 5), ("tx_errors", 1)])),
            None
        );
        assert_eq!(xdp_tx_errors(&[]), None);
    }

    #[test]
    fn loopback_has_no_driver_statistics_and_a_bad_name_is_an_error() {
        // lo answers GDRVINFO with no statistics (or refuses it): never a panic
        if let Ok(d) = driver_stats("lo") {
            assert!(xdp_tx_errors(&d.stats).is_none());
        }
        assert!(driver_stats("no-such-if-xyz").is_err());
        assert!(driver_stats("a-name-much-too-long-for-ifreq").is_err());
    }
}
