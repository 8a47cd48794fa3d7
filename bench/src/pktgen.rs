//! The kernel's packet generator (`pktgen.ko`, /proc/net/pktgen) driven from a
//! thread in a network namespace: one device on `kpktgend_0`, a UDP flood of a
//! fixed count, and its result line parsed.
use std::{net::Ipv4Addr, path::PathBuf};

use anyhow::{Context, bail};

/// One flood: `count` UDP packets of `size` bytes out of `dev` to `dst_mac`,
/// `dst`:`udp_dst`, from `src` with source ports cycling through `sports`.
pub(crate) struct Flood<'a> {
    pub dev: &'a str,
    pub dst_mac: &'a str,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub udp_dst: u16,
    pub sports: (u16, u16),
    pub count: u64,
    pub size: u32,
}

/// What pktgen reports after a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outcome {
    /// Packets sent.
    pub sent: u64,
    /// Microseconds from the first to the last packet.
    pub usec: u64,
    /// Packets per second, pktgen's own figure.
    pub pps: u64,
}

fn dir() -> PathBuf {
    // /proc/net follows the process's namespace; thread-self follows this thread's
    PathBuf::from("/proc/thread-self/net/pktgen")
}

fn write(file: &str, cmd: &str) -> anyhow::Result<()> {
    // the kernel strips the last byte of a pgctrl command: end each with a newline
    std::fs::write(dir().join(file), format!("{cmd}\n"))
        .with_context(|| format!("pktgen: {cmd:?} to {file} (is pktgen.ko loaded?)"))
}

/// Runs `f` from namespace `ns` (the thread enters it) and waits for the end.
pub(crate) fn run(ns: &str, f: &Flood) -> anyhow::Result<Outcome> {
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<Outcome> {
            ringlb_ops::netns::enter_named(ns)?;
            write("kpktgend_0", "rem_device_all")?;
            write("kpktgend_0", &format!("add_device {}", f.dev))?;
            for cmd in [
                format!("count {}", f.count),
                // veth clears IFF_TX_SKB_SHARING: a new skb per packet
                "clone_skb 0".into(),
                format!("pkt_size {}", f.size),
                "delay 0".into(),
                format!("dst_mac {}", f.dst_mac),
                format!("src_min {}", f.src),
                format!("src_max {}", f.src),
                format!("dst {}", f.dst),
                format!("udp_dst_min {}", f.udp_dst),
                format!("udp_dst_max {}", f.udp_dst),
                format!("udp_src_min {}", f.sports.0),
                format!("udp_src_max {}", f.sports.1),
            ] {
                write(f.dev, &cmd)?;
            }
            // blocks until the count is sent
            write("pgctrl", "start")?;
            let text = std::fs::read_to_string(dir().join(f.dev))?;
            write("kpktgend_0", "rem_device_all")?;
            parse(&text).with_context(|| format!("pktgen's result for {}: {text}", f.dev))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("pktgen thread panicked"))?
    })
}

/// Parses pktgen's device file after a run:
/// `Result: OK: 1234(c1200+d34) usec, 1000 (60byte,0frags)` then `  810pps ...`.
pub(crate) fn parse(text: &str) -> anyhow::Result<Outcome> {
    let Some(at) = text.find("Result: ") else {
        bail!("no Result line")
    };
    let rest = &text[at + "Result: ".len()..];
    let Some(ok) = rest.strip_prefix("OK: ") else {
        bail!("not OK: {}", rest.lines().next().unwrap_or(""))
    };
    let num = |s: &str| -> anyhow::Result<u64> {
        let d: String = s.chars().take_while(char::is_ascii_digit).collect();
        d.parse().with_context(|| format!("a number at {s:?}"))
    };
    let usec = num(ok)?;
    let after = ok.split_once("usec, ").context("no 'usec, '")?.1;
    let sent = num(after)?;
    let pps_at = after.find("pps").context("no pps")?;
    let start = after[..pps_at]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let pps = num(&after[start..pps_at])?;
    Ok(Outcome { sent, usec, pps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_result() {
        let t = "Params: count 1000\nCurrent:\n     pkts-sofar: 1000\nResult: OK: 12345(c12000+d345) usec, 1000 (60byte,0frags)\n  81004pps 38Mb/sec (38881920bps) errors: 0\n";
        assert_eq!(
            parse(t).unwrap(),
            Outcome {
                sent: 1000,
                usec: 12345,
                pps: 81004
            }
        );
    }

    #[test]
    fn refuses_a_failure() {
        assert!(parse("Result: Idle\n").is_err());
        assert!(parse("Result: No such parameter \"x\"\n").is_err());
        assert!(parse("nothing").is_err());
    }
}
