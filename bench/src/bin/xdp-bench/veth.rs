//! Section `veth`: packets per second through a real veth pair with native
//! XDP. Netns A's `a0` sends frames (AF_PACKET, sendmmsg, qdisc bypassed) to
//! its peer `b0` in netns B, where the program under test runs natively and
//! sends each frame back by XDP_TX; `a0` drops what comes back (XDP_DROP,
//! native). The figure is b0's XDP_TX count (`ethtool -S`: rx_queue_0_xdp_tx)
//! per second of sending. The floor program and ringlb_xdp take turns on the
//! same pair, same frames (ACKs of established flows), in one run.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use aya::programs::{Xdp, XdpMode};
use ringlb_ops::netns::enter_named;
use ringlb_testkit::netns::{Netns, run as sh};
use ringlb_xdp::xdp::{AttachMode, objects};

use crate::Args;
use crate::check;
use crate::setup::{ack, desired, load};

/// Established flows the frames belong to (round robin).
const FLOWS: u32 = 1000;

#[allow(unsafe_code)]
mod packet_socket {
    //! An AF_PACKET socket bound to one interface, sending prebuilt frames
    //! with sendmmsg, past the qdisc.
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use ringlb_ops::sockopt;

    pub(super) struct Sender(OwnedFd);

    /// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in seconds:
    /// with tick accounting and no IRQ-time accounting it includes the
    /// softirq work done in the thread's syscalls (veth's XDP).
    pub(super) fn thread_cpu_secs() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    /// An AF_PACKET socket bound to one interface that receives what
    /// arrives on it (not what it sends), with a receive timeout.
    pub(super) struct Receiver(OwnedFd);

    /// Binds the AF_PACKET socket `fd` to `ifindex`, for `protocol` (network
    /// order; 0: bound for sending only).
    fn bind_packet(fd: libc::c_int, ifindex: i32, protocol: u16) -> io::Result<()> {
        // SAFETY: a zeroed sockaddr_ll with family, protocol and ifindex set.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = protocol;
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
        Ok(())
    }

    impl Receiver {
        pub(super) fn bind(ifindex: i32) -> io::Result<Self> {
            let all = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket(2); the fd is owned by OwnedFd right away.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all)) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fd is a fresh, valid descriptor nobody else owns.
            let s = Self(unsafe { OwnedFd::from_raw_fd(fd) });
            let tv = libc::timeval {
                tv_sec: 1,
                tv_usec: 0,
            };
            sockopt::set_int(fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
            sockopt::set(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
            bind_packet(fd, ifindex, all)?;
            Ok(s)
        }

        /// One frame, or None after the timeout.
        pub(super) fn recv(&self) -> io::Result<Option<Vec<u8>>> {
            let mut buf = vec![0u8; 2048];
            // SAFETY: buf is valid for writes of its length.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Ok(None),
                    _ => Err(e),
                };
            }
            buf.truncate(n as usize);
            Ok(Some(buf))
        }
    }

    impl Sender {
        pub(super) fn bind(ifindex: i32) -> io::Result<Self> {
            // SAFETY: plain socket(2); the fd is owned by OwnedFd right away.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fd is a fresh, valid descriptor nobody else owns.
            let s = Self(unsafe { OwnedFd::from_raw_fd(fd) });
            sockopt::set_int(fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1)?;
            bind_packet(fd, ifindex, 0)?;
            Ok(s)
        }

        /// Sends `frames` with one sendmmsg; returns how many went out.
        pub(super) fn send(&self, frames: &[Vec<u8>]) -> io::Result<usize> {
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
#[derive(Clone, Copy)]
enum OnB0 {
    Floor,
    /// a build of ringlb_xdp
    Lb(&'static [u8]),
}

/// Attaches the floor object's program `name` (`ringlb_drop` or
/// `ringlb_pass`) to a0, natively, from a thread in netns A.
fn on_a0(na: &Netns, name: &'static str) -> anyhow::Result<aya::Ebpf> {
    let nan = na.0.clone();
    std::thread::spawn(move || -> anyhow::Result<aya::Ebpf> {
        enter_named(&nan)?;
        let mut e = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
        let p: &mut Xdp = e.program_mut(name).context(name)?.try_into()?;
        p.load()?;
        p.attach("a0", XdpMode::Driver)?;
        Ok(e)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a0 thread panicked"))?
}

/// Detaches what [`on_a0`] attached (from netns A, like the attach).
fn off_a0(na: &Netns, e: aya::Ebpf) -> anyhow::Result<()> {
    let nan = na.0.clone();
    std::thread::spawn(move || -> anyhow::Result<()> {
        enter_named(&nan)?;
        drop(e);
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a0 thread panicked"))?
}

/// Outside the timed run: a0 takes XDP_PASS instead of XDP_DROP, sends the
/// first 64 of `frames` once, and every frame b0 sends back is checked
/// against the frame it came from (the one whose IP packet it ends with);
/// then XDP_DROP again. Returns how many were checked (all 64, or an error).
fn check_returned(
    na: &Netns,
    a0: &mut Option<aya::Ebpf>,
    prog: OnB0,
    frames: &[Vec<u8>],
    backends: u32,
) -> anyhow::Result<usize> {
    let batch = &frames[..64.min(frames.len())];
    if let Some(e) = a0.take() {
        off_a0(na, e)?;
    }
    let pass = on_a0(na, "ringlb_pass")?;
    let nan = na.0.clone();
    let got = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<Vec<Vec<u8>>> {
            enter_named(&nan)?;
            let idx = ringlb_xdp::batch::if_index("a0") as i32;
            let rx = packet_socket::Receiver::bind(idx)?;
            packet_socket::Sender::bind(idx)?.send(batch)?;
            let mut got = Vec::new();
            while got.len() < batch.len() {
                match rx.recv()? {
                    // IPv4 only: the link's own IPv6 solicitations are not ours
                    Some(f) if f.get(12..14) == Some(&[0x08, 0x00][..]) => got.push(f),
                    Some(_) => {}
                    None => break,
                }
            }
            Ok(got)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("a0 receiver panicked"))
    })??;
    off_a0(na, pass)?;
    *a0 = Some(on_a0(na, "ringlb_drop")?);
    if got.len() != batch.len() {
        bail!("b0 sent back {} of {} frames", got.len(), batch.len());
    }
    let mut seen = vec![false; batch.len()];
    for out in &got {
        let k = batch
            .iter()
            .position(|i| out.ends_with(&i[14..]))
            .with_context(|| format!("a frame from no input: {out:02x?}"))?;
        ensure!(!seen[k], "frame {k} came back twice");
        seen[k] = true;
        match prog {
            OnB0::Floor => check::macs_swapped(&batch[k], out)?,
            OnB0::Lb(_) => {
                check::encapped(&batch[k], out, 0, backends)?;
            }
        }
    }
    Ok(got.len())
}

struct Figure {
    checked: usize,
    sent: u64,
    xdp: u64,
    tx: u64,
    tx_errors: u64,
    secs: f64,
    /// the sender thread's CPU time (send syscalls and the softirq they run)
    cpu: f64,
}

/// Attaches `prog` to b0 (natively, in netns B), sends `frames` from a0 for
/// `secs`, detaches. Returns what was sent and what b0's XDP counted.
fn run_one(
    na: &Netns,
    nb: &Netns,
    a0: &mut Option<aya::Ebpf>,
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
                    OnB0::Lb(object) => {
                        let mut dp = load(object, &desired(1, a.backends, a.ring)?)?;
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
        let checked = check_returned(na, a0, prog, frames, a.backends)?;
        let stats = || -> anyhow::Result<[u64; 3]> {
            Ok([
                xdp_stat(nb, "rx_queue_0_xdp_packets")?,
                xdp_stat(nb, "rx_queue_0_xdp_tx")?,
                xdp_stat(nb, "rx_queue_0_xdp_tx_errors")?,
            ])
        };
        let [xdp0, tx0, err0] = stats()?;
        let nan = na.0.clone();
        let sender = s.spawn(move || -> anyhow::Result<(u64, f64, f64)> {
            enter_named(&nan)?;
            let idx = ringlb_xdp::batch::if_index("a0") as i32;
            if idx == 0 {
                bail!("no a0 in netns A");
            }
            let sock = packet_socket::Sender::bind(idx)?;
            let cpu0 = packet_socket::thread_cpu_secs();
            let t = Instant::now();
            let until = Duration::from_secs(secs);
            let mut sent = 0u64;
            for batch in frames.chunks(64).cycle() {
                sent += sock.send(batch)? as u64;
                if sent % 4096 < 64 && t.elapsed() >= until {
                    break;
                }
            }
            let wall = t.elapsed().as_secs_f64();
            Ok((sent, wall, packet_socket::thread_cpu_secs() - cpu0))
        });
        let sent = sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))?;
        let [xdp1, tx1, err1] = stats()?;
        let _ = done_tx.send(());
        holder
            .join()
            .map_err(|_| anyhow::anyhow!("b0 thread panicked"))?;
        let (sent, secs, cpu) = sent?;
        Ok(Figure {
            checked,
            sent,
            xdp: xdp1 - xdp0,
            tx: tx1 - tx0,
            tx_errors: err1 - err0,
            secs,
            cpu,
        })
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) fn section_veth(a: &Args) -> anyhow::Result<()> {
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
    // a0 drops what b0 sends back (veth delivers XDP_TX frames only to a
    // peer with XDP); XDP_PASS while the frames are checked (check_returned)
    let mut a0 = Some(on_a0(&na, "ringlb_drop")?);
    let frames: Vec<Vec<u8>> = (0..FLOWS).map(|k| ack(0, 1000 + k)).collect();
    println!("## veth pair, native XDP: packets per second\n");
    println!(
        "a0 (netns A) sends 64-byte TCP ACKs of {FLOWS} flows to VIP 0 round robin (AF_PACKET, sendmmsg of 64, \
         PACKET_QDISC_BYPASS) for {} s per program and round, {} rounds, the programs in turn within each round; \
         b0 (netns B) runs the program natively and XDP_TXes every frame back; a0 drops them (native XDP_DROP). \
         veth runs b0's XDP in the sender's softirq on the same CPU, so a packet's time is the send plus b0's \
         program plus the XDP_TX to a0: the ratio understates the programs' own difference. pps = b0's \
         rx_queue_0_xdp_tx per second of the send loop; per CPU-s = per second of the sender thread's CPU time \
         (its syscalls and the softirq they run: b0's XDP), which a shared machine's other load does not shrink \
         as it shrinks pps; `vs floor` = against the floor's per CPU-s of the same round, and the medians over the \
         rounds are the figure. Before each timed run (not \
         timed, not counted), a0 passes instead of dropping and one batch of 64 frames goes through: every frame \
         b0 sends back is checked (`checked`: the floor's MACs swapped; ringlb's next-hop MACs, outer header and \
         checksum, a backend of the VIP, the inner packet intact).\n",
        a.veth_secs, a.veth_rounds
    );
    println!(
        "| round | program on b0 | checked | sent | b0 XDP packets | b0 XDP_TX | XDP_TX errors | seconds | sender CPU s | XDP_TX pps | XDP_TX per CPU-s | vs floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let progs = [
        ("ringlb_floor", OnB0::Floor),
        ("ringlb_xdp", OnB0::Lb(objects::XDP_LB)),
    ];
    let mut ratios = vec![Vec::new(); progs.len()];
    let mut rates = vec![Vec::new(); progs.len()];
    for round in 1..=a.veth_rounds {
        let mut floor_rate = 0.0;
        for (k, (name, prog)) in progs.iter().enumerate() {
            let f = run_one(&na, &nb, &mut a0, *prog, &frames, a.veth_secs, a)?;
            // a frame XDP_TX could not queue on a0 (its ring full) is an
            // error of the link, not a frame the program kept
            if f.tx + f.tx_errors + FLOWS as u64 + 64 < f.xdp {
                bail!("{name}: b0's XDP sent back {} of {} frames", f.tx, f.xdp);
            }
            // per CPU-second of the sender: a sender the other load kept
            // off its CPU sends less, but not less per CPU-second
            let rate = f.tx as f64 / f.cpu;
            if k == 0 {
                floor_rate = rate;
            }
            ratios[k].push(rate / floor_rate);
            rates[k].push(rate);
            println!(
                "| {round} | {name} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.0} | {:.0} | {:.2} |",
                f.checked,
                f.sent,
                f.xdp,
                f.tx,
                f.tx_errors,
                f.secs,
                f.cpu,
                f.tx as f64 / f.secs,
                rate,
                rate / floor_rate
            );
        }
    }
    println!("\n| program on b0 | median XDP_TX per CPU-s | median vs floor | range vs floor |");
    println!("|---|---|---|---|");
    for (k, (name, _)) in progs.iter().enumerate() {
        if ratios[k].is_empty() {
            println!("| {name} | - | - | - |");
            continue;
        }
        let (lo, hi) = ratios[k]
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), r| (l.min(*r), h.max(*r)));
        println!(
            "| {name} | {:.0} | **{:.2}** | {lo:.2}–{hi:.2} |",
            median(&mut rates[k]),
            median(&mut ratios[k])
        );
    }
    println!();
    if let Some(e) = a0.take() {
        off_a0(&na, e)?;
    }
    Ok(())
}
