//! Timed BPF_PROG_TEST_RUN calls that the packet sections share (`packet`,
//! `ranges`, Katran's rows): method S, and a flow's handshake timed packet by
//! packet. Every call checks its verdict and its output frame.

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{Context, bail};
use ringlb_xdp::xdp::test_run;

use crate::setup::{XDP_TX, ack, syn};

type Prog = aya::programs::Xdp;

/// One call with repeat = 1: the kernel-reported duration. Checks the verdict
/// and the output frame.
fn once(
    prog: &Prog,
    p: &[u8],
    want: u32,
    check: impl Fn(&[u8], &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Duration> {
    let mut out = [0u8; 256];
    let (verdict, len, d) = test_run(prog, p, &mut out, 1)?;
    if verdict != want {
        bail!("verdict {verdict}, expected {want}");
    }
    check(p, &out[..len])?;
    Ok(d)
}

/// Method S: `calls` calls with repeat = 1, `pkt(i)` each; mean kernel duration.
pub(crate) fn method_s(
    prog: &Prog,
    calls: u32,
    want: u32,
    pkt: impl Fn(u32) -> Vec<u8>,
    check: impl Fn(&[u8], &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut total = Duration::ZERO;
    for i in 0..calls {
        total += once(prog, &pkt(i), want, &check).with_context(|| format!("call {i}"))?;
    }
    Ok(total.as_nanos() as f64 / f64::from(calls))
}

/// New flows `first..first + n` of VIP `vip`: each flow's SYN, then its first
/// ACK (the handshake), timed apart (method S). `to(input, output)` checks an
/// encapsulated frame and returns its backend; both must reach the same one.
/// Returns the mean ns of the SYNs and of the ACKs.
pub(crate) fn handshakes(
    prog: &Prog,
    vip: u32,
    first: u32,
    n: u32,
    to: impl Fn(&[u8], &[u8]) -> anyhow::Result<Ipv4Addr>,
) -> anyhow::Result<(f64, f64)> {
    let (mut s, mut a) = (Duration::ZERO, Duration::ZERO);
    let mut out = [0u8; 256];
    for i in first..first + n {
        let mut dst = [Ipv4Addr::UNSPECIFIED; 2];
        for (k, p) in [syn(vip, i), ack(vip, i)].iter().enumerate() {
            let (verdict, len, d) = test_run(prog, p, &mut out, 1)?;
            if verdict != XDP_TX {
                bail!("flow {i} packet {k}: verdict {verdict}");
            }
            dst[k] = to(p, &out[..len]).with_context(|| format!("flow {i}"))?;
            if k == 0 {
                s += d;
            } else {
                a += d;
            }
        }
        if dst[0] != dst[1] {
            bail!("flow {i}: SYN to {}, its ACK to {}", dst[0], dst[1]);
        }
    }
    let n = f64::from(n);
    Ok((s.as_nanos() as f64 / n, a.as_nanos() as f64 / n))
}
