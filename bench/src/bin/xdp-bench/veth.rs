//! Section `veth`: packets per second through a real veth pair with native
//! XDP. Netns A's `a0` sends frames (AF_PACKET, sendmmsg, qdisc bypassed) to
//! its peer `b0` in netns B, where the program under test runs natively and
//! sends each frame back by XDP_TX; `a0` drops what comes back (XDP_DROP,
//! native). The figure is b0's XDP_TX count (`ethtool -S`: rx_queue_0_xdp_tx)
//! per second of sending. The floor program and ringlb_xdp take turns on the
//! same pair, same frames (ACKs of established flows), in one run.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aya::programs::{Xdp, XdpMode};
use ringlb_ops::netns::enter_named;
use ringlb_testkit::netns::{Netns, run as sh};
use ringlb_xdp::xdp::{AttachMode, objects};

use crate::Args;
use crate::setup::{ack, desired, load};

/// Established flows the frames belong to (round robin).
const FLOWS: u32 = 1000;

#[allow(unsafe_code)]
mod packet_socket {
    //! An AF_PACKET socket bound to one interface, sending prebuilt frames
    //! with sendmmsg, past the qdisc.
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    pub struct Sender(OwnedFd);

    impl Sender {
        pub fn bind(ifindex: i32) -> io::Result<Self> {
            // SAFETY: plain socket(2); the fd is owned by OwnedFd right away.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fd is a fresh, valid descriptor nobody else owns.
            let s = Self(unsafe { OwnedFd::from_raw_fd(fd) });
            let one: libc::c_int = 1;
            // SAFETY: a c_int option of the right size.
            let r = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_PACKET,
                    libc::PACKET_QDISC_BYPASS,
                    (&one as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a zeroed sockaddr_ll with family and ifindex set.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = ifindex;
            // SAFETY: sll is valid for its size; bind does not keep it.
            let r = unsafe {
                libc::bind(
                    fd,
                    (&sll as *const libc::sockaddr_ll).cast(),
                    size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(s)
        }

        /// Sends `frames` with one sendmmsg; returns how many went out.
        pub fn send(&self, frames: &[Vec<u8>]) -> io::Result<usize> {
            let mut iov: Vec<libc::iovec> = frames
                .iter()
                .map(|f| libc::iovec {
                    iov_base: f.as_ptr() as *mut libc::c_void,
                    iov_len: f.len(),
                })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = iov
                .iter_mut()
                .map(|v| {
                    // SAFETY: an all-zero msghdr is valid (no name, no control).
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_iov = v;
                    m.msg_hdr.msg_iovlen = 1;
                    m
                })
                .collect();
            // SAFETY: msgs point at iovecs that point at frames, all alive
            // for the call; the kernel only reads them.
            let n = unsafe {
                libc::sendmmsg(self.0.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0)
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }
    }
}

/// One of b0's per-queue XDP counters (`ethtool -S b0` in netns B).
fn xdp_stat(nb: &Netns, name: &str) -> anyhow::Result<u64> {
    let out = nb.exec(&["ethtool", "-S", "b0"])?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().parse::<u64>().context("ethtool value"))
        .sum()
}

/// What runs on b0 while the sender sends.
enum OnB0 {
    Floor,
    Ringlb,
}

struct Figure {
    sent: u64,
    xdp: u64,
    tx: u64,
    secs: f64,
}

/// Attaches `prog` to b0 (natively, in netns B), sends `frames` from a0 for
/// `secs`, detaches. Returns what was sent and what b0's XDP counted.
fn run_one(
    na: &Netns,
    nb: &Netns,
    prog: OnB0,
    frames: &[Vec<u8>],
    secs: u64,
    a: &Args,
) -> anyhow::Result<Figure> {
    let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<()>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| -> anyhow::Result<Figure> {
        let nbn = nb.0.clone();
        let holder = s.spawn(move || {
            let attach = || -> anyhow::Result<Box<dyn std::any::Any>> {
                enter_named(&nbn)?;
                Ok(match prog {
                    OnB0::Floor => {
                        let mut e = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
                        let p: &mut Xdp =
                            e.program_mut("ringlb_floor").context("floor")?.try_into()?;
                        p.load()?;
                        p.attach("b0", XdpMode::Driver)?;
                        Box::new(e)
                    }
                    OnB0::Ringlb => {
                        let mut dp = load(objects::XDP_LB, &desired(1, a.backends, a.ring)?)?;
                        dp.attach("b0", AttachMode::Native)?;
                        Box::new(dp)
                    }
                })
            };
            match attach() {
                Ok(keep) => {
                    let _ = ready_tx.send(Ok(()));
                    let _ = done_rx.recv();
                    drop(keep); // detaches
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        });
        ready_rx.recv().context("b0 thread")??;
        let (xdp0, tx0) = (
            xdp_stat(nb, "rx_queue_0_xdp_packets")?,
            xdp_stat(nb, "rx_queue_0_xdp_tx")?,
        );
        let nan = na.0.clone();
        let sender = s.spawn(move || -> anyhow::Result<(u64, f64)> {
            enter_named(&nan)?;
            let idx = ringlb_xdp::batch::if_index("a0") as i32;
            if idx == 0 {
                bail!("no a0 in netns A");
            }
            let sock = packet_socket::Sender::bind(idx)?;
            let t = Instant::now();
            let until = Duration::from_secs(secs);
            let mut sent = 0u64;
            for batch in frames.chunks(64).cycle() {
                sent += sock.send(batch)? as u64;
                if sent % 4096 < 64 && t.elapsed() >= until {
                    break;
                }
            }
            Ok((sent, t.elapsed().as_secs_f64()))
        });
        let sent = sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))?;
        let (xdp1, tx1) = (
            xdp_stat(nb, "rx_queue_0_xdp_packets")?,
            xdp_stat(nb, "rx_queue_0_xdp_tx")?,
        );
        let _ = done_tx.send(());
        holder
            .join()
            .map_err(|_| anyhow::anyhow!("b0 thread panicked"))?;
        let (sent, secs) = sent?;
        Ok(Figure {
            sent,
            xdp: xdp1 - xdp0,
            tx: tx1 - tx0,
            secs,
        })
    })
}

pub fn section_veth(a: &Args) -> anyhow::Result<()> {
    let pid = std::process::id();
    let na = Netns::create(&format!("rlbv-a-{pid}"))?;
    let nb = Netns::create(&format!("rlbv-b-{pid}"))?;
    sh(&[
        "ip", "-n", &na.0, "link", "add", "a0", "type", "veth", "peer", "name", "b0", "netns",
        &nb.0,
    ])?;
    na.exec(&[
        "ip",
        "link",
        "set",
        "a0",
        "address",
        "02:00:00:00:00:02",
        "up",
    ])?;
    nb.exec(&[
        "ip",
        "link",
        "set",
        "b0",
        "address",
        "02:00:00:00:00:01",
        "up",
    ])?;
    // a0 drops what b0 sends back (veth delivers XDP_TX frames only to a peer with XDP)
    let nan = na.0.clone();
    let _drop = std::thread::spawn(move || -> anyhow::Result<aya::Ebpf> {
        enter_named(&nan)?;
        let mut e = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
        let p: &mut Xdp = e.program_mut("ringlb_drop").context("drop")?.try_into()?;
        p.load()?;
        p.attach("a0", XdpMode::Driver)?;
        Ok(e)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a0 thread panicked"))??;
    let frames: Vec<Vec<u8>> = (0..FLOWS).map(|k| ack(0, 1000 + k)).collect();
    println!("## veth pair, native XDP: packets per second\n");
    println!(
        "a0 (netns A) sends 64-byte TCP ACKs of {FLOWS} flows to VIP 0 round robin (AF_PACKET, sendmmsg of 64, \
         PACKET_QDISC_BYPASS) for {} s per program; b0 (netns B) runs the program natively and XDP_TXes every \
         frame back; a0 drops them (native XDP_DROP). veth runs b0's XDP in the sender's softirq on the same CPU, so \
         a packet's time is the send plus b0's program plus the XDP_TX to a0: the ratio understates the programs' \
         own difference. pps = b0's rx_queue_0_xdp_tx per second.\n",
        a.veth_secs
    );
    println!(
        "| program on b0 | sent | b0 XDP packets | b0 XDP_TX | seconds | XDP_TX pps | vs floor |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut floor_pps = 0.0;
    for (name, prog) in [("ringlb_floor", OnB0::Floor), ("ringlb_xdp", OnB0::Ringlb)] {
        let f = run_one(&na, &nb, prog, &frames, a.veth_secs, a)?;
        if f.tx + FLOWS as u64 + 64 < f.xdp {
            bail!("{name}: b0's XDP sent back {} of {} frames", f.tx, f.xdp);
        }
        let pps = f.tx as f64 / f.secs;
        if floor_pps == 0.0 {
            floor_pps = pps;
        }
        println!(
            "| {name} | {} | {} | {} | {:.1} | {:.0} | {:.2} |",
            f.sent,
            f.xdp,
            f.tx,
            f.secs,
            pps,
            pps / floor_pps
        );
    }
    println!();
    Ok(())
}
