//! bgp-scale-bench: how long until a BIRD 2 ToR holds N /32 VIPs announced by our
//! speaker, side by side with gobgpd announcing the same N routes, in the same run.
//!
//! ```text
//! cargo build --release -p ringlb-bench --bin bgp-scale-bench
//! sudo target/release/bgp-scale-bench --routes 20000 --rounds 5
//! ```
//!
//! Lab (network namespaces, deleted on exit): `tor` runs BIRD (no kernel export, so
//! the figure is BGP + BIRD's RIB only); `e1` runs our speaker in this process (a
//! thread moved into the namespace with setns); `e2` runs gobgpd. For each round and
//! each speaker: establish the session first, then
//! - ours: t0, `Speaker::announce_many(N prefixes)`;
//! - gobgpd: t0, `gobgp mrt inject global FILE` (an MRT TABLE_DUMP_V2 file with the
//!   same N prefixes, written by this program; the batch path of gobgp's CLI, over
//!   gRPC; a `gobgp global rib add` per prefix takes ~10 ms each);
//!
//! and stop the clock when one persistent `birdc` session reports N routes from that
//! protocol (`show route protocol P count`, polled every ~2 ms). The session is then
//! torn down and BIRD is back at 0 routes before the next measurement.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ipnetwork::IpNetwork;
use prometheus_client::registry::Registry;
use ringlb_bgp::codec::Afi;
use ringlb_bgp::fsm::State;
use ringlb_bgp::{PeerConfig, RouteAttrs, Speaker};

const TOR: &str = "10.92.0.1";
const OURS: &str = "10.92.0.11";
const GOBGP: &str = "10.92.0.12";
const API_PORT: &str = "50071";

/// `cmd args...` (see `ringlb_testkit::netns::run`).
fn sh(cmd: &str, args: &[&str]) -> anyhow::Result<String> {
    let argv: Vec<&str> = std::iter::once(cmd).chain(args.iter().copied()).collect();
    ringlb_testkit::netns::run(&argv)
}

/// Namespaces, daemons and files of the run; all removed on drop.
struct Lab {
    prefix: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Lab {
    fn ns(&self, s: &str) -> String {
        format!("{}-{s}", self.prefix)
    }

    fn new() -> anyhow::Result<Lab> {
        let prefix = format!("rlbench{}", std::process::id());
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir)?;
        let lab = Lab {
            prefix,
            dir,
            children: Vec::new(),
        };
        for n in ["tor", "e1", "e2"] {
            sh("ip", &["netns", "add", &lab.ns(n)])?;
            sh("ip", &["-n", &lab.ns(n), "link", "set", "lo", "up"])?;
        }
        let tor = lab.ns("tor");
        sh("ip", &["-n", &tor, "link", "add", "br0", "type", "bridge"])?;
        sh(
            "ip",
            &[
                "-n",
                &tor,
                "addr",
                "add",
                &format!("{TOR}/24"),
                "dev",
                "br0",
            ],
        )?;
        sh("ip", &["-n", &tor, "link", "set", "br0", "up"])?;
        for (i, (n, a)) in [("e1", OURS), ("e2", GOBGP)].iter().enumerate() {
            let port = format!("ve{i}");
            sh(
                "ip",
                &[
                    "-n",
                    &tor,
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &lab.ns(n),
                ],
            )?;
            sh(
                "ip",
                &["-n", &tor, "link", "set", &port, "master", "br0", "up"],
            )?;
            sh(
                "ip",
                &[
                    "-n",
                    &lab.ns(n),
                    "addr",
                    "add",
                    &format!("{a}/24"),
                    "dev",
                    "eth0",
                ],
            )?;
            sh("ip", &["-n", &lab.ns(n), "link", "set", "eth0", "up"])?;
        }
        Ok(lab)
    }

    fn spawn(&mut self, ns: &str, cmd: &str, args: &[&str], log: &str) -> anyhow::Result<usize> {
        let f = std::fs::File::create(self.dir.join(log))?;
        let c = Command::new("ip")
            .args(["netns", "exec", &self.ns(ns), cmd])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("starting {cmd}"))?;
        self.children.push(c);
        Ok(self.children.len() - 1)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in ["tor", "e1", "e2"] {
            let _ = sh("ip", &["netns", "del", &self.ns(n)]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One long-lived birdc, so polling costs a round trip on the control socket, not a
/// process start.
struct Birdc {
    _child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Birdc {
    fn new(lab: &Lab) -> anyhow::Result<Birdc> {
        let sock = lab.dir.join("bird.ctl");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &lab.ns("tor"), "birdc", "-s"])
            .arg(&sock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take().context("birdc stdin")?;
        let out = BufReader::new(child.stdout.take().context("birdc stdout")?);
        Ok(Birdc {
            _child: child,
            stdin,
            out,
        })
    }

    /// Routes BIRD holds from protocol `p`.
    fn count(&mut self, p: &str) -> anyhow::Result<usize> {
        let line = self.ask(&format!("show route protocol {p} count"), |l| {
            l.contains(" of ")
        })?;
        // birdc echoes a prompt and terminal escapes in front of the count.
        let (head, _) = line.split_once(" of ").context("no count")?;
        let digits: String = head
            .trim_end()
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Ok(digits.parse().unwrap_or(0))
    }

    fn wait(&mut self, p: &str, want: usize, limit: Duration) -> anyhow::Result<Duration> {
        let t = Instant::now();
        loop {
            if self.count(p)? == want {
                return Ok(t.elapsed());
            }
            if t.elapsed() > limit {
                let got = self.count(p)?;
                writeln!(self.stdin, "show protocols all {p}")?;
                self.stdin.flush()?;
                let mut dump = String::new();
                for _ in 0..30 {
                    let mut l = String::new();
                    if self.out.read_line(&mut l)? == 0 {
                        break;
                    }
                    dump.push_str(&l);
                }
                bail!("protocol {p}: {got} routes, want {want}\n{dump}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Run a command; read until a line satisfies `done`, and return that line.
    fn ask(&mut self, cmd: &str, done: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.out.read_line(&mut line)? == 0 {
                bail!("birdc exited");
            }
            if done(&line) {
                return Ok(line);
            }
        }
    }

    /// Run a command; read until a line contains `expect`.
    fn cmd(&mut self, cmd: &str, expect: &str) -> anyhow::Result<()> {
        self.ask(cmd, |l| l.contains(expect)).map(drop)
    }

    /// Poll until protocol `p` is Established; returns when it was seen.
    fn wait_established(&mut self, p: &str, limit: Duration) -> anyhow::Result<Instant> {
        let t = Instant::now();
        loop {
            if self.established(p)? {
                return Ok(Instant::now());
            }
            if t.elapsed() > limit {
                bail!("protocol {p} not Established");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn established(&mut self, p: &str) -> anyhow::Result<bool> {
        let line = self.ask(&format!("show protocols {p}"), |l| l.starts_with(p))?;
        Ok(line.contains("Established"))
    }
}

fn prefixes(n: usize) -> Vec<IpNetwork> {
    (0..n as u32)
        .map(|i| IpNetwork::new(Ipv4Addr::from(0x0a64_0000 + i).into(), 32).expect("valid /32"))
        .collect()
}

/// MRT TABLE_DUMP_V2 (RFC 6396): a PEER_INDEX_TABLE and one RIB_IPV4_UNICAST record
/// per prefix with ORIGIN IGP, an empty AS_PATH and NEXT_HOP = gobgpd's address.
///
/// `gobgp mrt inject` (3.10) exits before its gRPC stream is flushed and loses the
/// last few hundred paths (seen: 75-330 of 2,000), so `padding` filler prefixes from
/// 10.101.0.0/16 follow the measured ones; BIRD's import filter rejects them.
fn write_mrt(path: &Path, ps: &[IpNetwork], padding: usize) -> anyhow::Result<()> {
    fn rec(out: &mut Vec<u8>, subtype: u16, body: &[u8]) {
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&13u16.to_be_bytes());
        out.extend_from_slice(&subtype.to_be_bytes());
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(body);
    }
    let nh: Ipv4Addr = GOBGP.parse()?;
    let mut out = Vec::new();
    let mut pit = Vec::new();
    pit.extend_from_slice(&nh.octets()); // collector id
    pit.extend_from_slice(&0u16.to_be_bytes()); // view name length
    pit.extend_from_slice(&1u16.to_be_bytes()); // peer count
    pit.push(0x02); // AS4, IPv4
    pit.extend_from_slice(&nh.octets());
    pit.extend_from_slice(&nh.octets());
    pit.extend_from_slice(&65012u32.to_be_bytes());
    rec(&mut out, 1, &pit);
    let attrs = [0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4];
    let pad: Vec<IpNetwork> = (0..padding as u32)
        .map(|i| IpNetwork::new(Ipv4Addr::from(0x0a65_0000 + i).into(), 32).expect("valid /32"))
        .collect();
    for (seq, p) in ps.iter().chain(pad.iter()).enumerate() {
        let mut b = Vec::new();
        b.extend_from_slice(&(seq as u32).to_be_bytes());
        b.push(p.prefix());
        if let std::net::IpAddr::V4(a) = p.ip() {
            b.extend_from_slice(&a.octets()[..usize::from(p.prefix()).div_ceil(8)]);
        }
        b.extend_from_slice(&1u16.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes()); // peer index
        b.extend_from_slice(&0u32.to_be_bytes()); // originated
        b.extend_from_slice(&((attrs.len() + 4) as u16).to_be_bytes());
        b.extend_from_slice(&attrs);
        b.extend_from_slice(&nh.octets());
        rec(&mut out, 2, &b);
    }
    std::fs::write(path, out)?;
    Ok(())
}

#[allow(unsafe_code)] // setns(2): move this thread into the edge's network namespace
fn enter_netns(ns: &str) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("open netns {ns}"))?;
    // SAFETY: plain syscall on a valid namespace fd; affects only the calling thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!("setns {ns}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Our speaker in netns e1. `preload == false`: session up, then time announce ->
/// BIRD has all. `preload == true`: the routes are announced before the session exists;
/// time from BIRD seeing Established to BIRD having all (initial table transfer).
fn measure_ours(
    lab: &Lab,
    birdc: &mut Birdc,
    ps: &[IpNetwork],
    preload: bool,
) -> anyhow::Result<Duration> {
    let ns = lab.ns("e1");
    let pre: Vec<IpNetwork> = if preload { ps.to_vec() } else { Vec::new() };
    if preload {
        birdc.cmd("disable e1", "disabled")?;
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (up_tx, up_rx) = std::sync::mpsc::channel::<anyhow::Result<Speaker>>();
    let rt_thread = std::thread::spawn(move || -> anyhow::Result<()> {
        enter_netns(&ns)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut reg = Registry::default();
            let sp = Speaker::start(0, &mut reg)?;
            sp.announce_many(pre.into_iter().map(|p| (p, RouteAttrs::default())));
            sp.add_peer(PeerConfig {
                hold_time: 9,
                keepalive: 3,
                connect_retry: Duration::from_secs(1),
                families: vec![Afi::Ipv4],
                ..PeerConfig::new(TOR.parse()?, 65011, 65000, OURS.parse()?)
            })?;
            if preload {
                let _ = up_tx.send(Ok(sp));
                return anyhow::Ok(());
            }
            let mut st = sp.peer_status(TOR.parse()?).context("peer")?;
            tokio::time::timeout(
                Duration::from_secs(20),
                st.wait_for(|s| s.state == State::Established),
            )
            .await
            .context("session to BIRD not Established")??;
            let _ = up_tx.send(Ok(sp));
            anyhow::Ok(())
        })?;
        // Keep the runtime (and the speaker's tasks) alive until told to stop.
        let _ = rx.recv();
        drop(rt);
        Ok(())
    });
    let sp = up_rx.recv().context("speaker thread died")??;
    let t0 = if preload {
        birdc.cmd("enable e1", "enabled")?;
        birdc.wait_established("e1", Duration::from_secs(30))?
    } else {
        birdc.wait_established("e1", Duration::from_secs(30))?;
        let t0 = Instant::now();
        sp.announce_many(ps.iter().map(|p| (*p, RouteAttrs::default())));
        t0
    };
    birdc.wait("e1", ps.len(), Duration::from_secs(60))?;
    let took = t0.elapsed();
    drop(sp); // aborts the tasks: the socket closes, BIRD flushes the routes
    let _ = tx.send(());
    rt_thread
        .join()
        .map_err(|_| anyhow::anyhow!("speaker thread panicked"))??;
    birdc.wait("e1", 0, Duration::from_secs(20))?;
    Ok(took)
}

fn measure_gobgp(
    lab: &mut Lab,
    birdc: &mut Birdc,
    n: usize,
    mrt: &Path,
    preload: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let conf = format!(
        "[global.config]\n  as = 65012\n  router-id = \"{GOBGP}\"\n  port = 179\n\
         [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{TOR}\"\n    peer-as = 65000\n\
         \x20 [neighbors.timers.config]\n    hold-time = 9\n    keepalive-interval = 3\n    connect-retry = 1\n\
         \x20   idle-hold-time-after-reset = 1\n\
         \x20 [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n"
    );
    let f = lab.dir.join("gobgpd.toml");
    std::fs::write(&f, conf)?;
    let api = format!("127.0.0.1:{API_PORT}");
    let fs = f.display().to_string();
    if preload {
        birdc.cmd("disable g2", "disabled")?;
    }
    let idx = lab.spawn(
        "e2",
        "gobgpd",
        &[
            "-f",
            &fs,
            "-t",
            "toml",
            "--api-hosts",
            &api,
            "--pprof-disable",
        ],
        "gobgpd.log",
    )?;
    let e2 = lab.ns("e2");
    let m = mrt.display().to_string();
    let gobgp = |args: &[&str]| -> anyhow::Result<String> {
        let mut a = vec!["netns", "exec", e2.as_str(), "gobgp", "-p", API_PORT];
        a.extend_from_slice(args);
        sh("ip", &a)
    };
    let (t0, inject) = if preload {
        // Wait for gobgpd's API, load its RIB, check it holds all N, then let BIRD in.
        let t = Instant::now();
        while gobgp(&["global", "rib", "summary"]).is_err() {
            if t.elapsed() > Duration::from_secs(20) {
                bail!("gobgpd API not up");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        gobgp(&["mrt", "inject", "global", &m])?;
        let t = Instant::now();
        loop {
            let out = gobgp(&["global", "rib", "summary"])?;
            let have: usize = out
                .split("Destination: ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|x| x.trim().parse().ok())
                .unwrap_or(0);
            if have >= n {
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("gobgpd RIB holds {have} < {n} after mrt inject");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        birdc.cmd("enable g2", "enabled")?;
        (
            birdc.wait_established("g2", Duration::from_secs(30))?,
            Duration::ZERO,
        )
    } else {
        birdc.wait_established("g2", Duration::from_secs(30))?;
        let t0 = Instant::now();
        gobgp(&["mrt", "inject", "global", &m])?;
        (t0, t0.elapsed())
    };
    birdc.wait("g2", n, Duration::from_secs(120))?;
    let took = t0.elapsed();
    let c = &mut lab.children[idx];
    c.kill()?;
    c.wait()?;
    birdc.wait("g2", 0, Duration::from_secs(20))?;
    Ok((took, inject))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut routes = 20_000usize;
    let mut rounds = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--routes" => routes = args.next().context("--routes N")?.parse()?,
            "--rounds" => rounds = args.next().context("--rounds N")?.parse()?,
            o => bail!("unknown argument {o:?}; use --routes N --rounds N"),
        }
    }
    if routes > 65_536 {
        bail!("--routes at most 65536 (one /16 of /32s)");
    }
    let mut lab = Lab::new().context("building the namespace lab (needs root)")?;
    let bird_conf = format!(
        "router id {TOR};\nprotocol device {{ }}\n\
         template bgp edge {{ local {TOR} as 65000; direct; hold time 9; keepalive time 3;\n\
           connect delay time 1; connect retry time 1; error wait time 1, 2;\n\
           ipv4 {{ import where net ~ [ 10.100.0.0/16{{32,32}} ]; export none; }}; }}\n\
         protocol bgp e1 from edge {{ neighbor {OURS} as 65011; }}\n\
         protocol bgp g2 from edge {{ neighbor {GOBGP} as 65012; }}\n"
    );
    let conf = lab.dir.join("bird.conf");
    std::fs::write(&conf, bird_conf)?;
    let (c, s) = (
        conf.display().to_string(),
        lab.dir.join("bird.ctl").display().to_string(),
    );
    lab.spawn("tor", "bird", &["-f", "-c", &c, "-s", &s], "bird.log")?;
    std::thread::sleep(Duration::from_millis(300));
    let mut birdc = Birdc::new(&lab)?;
    let ps = prefixes(routes);
    let mrt = lab.dir.join("routes.mrt");
    write_mrt(&mrt, &ps, (routes / 2).max(2_000))?;

    println!(
        "bgp-scale-bench: {routes} /32 routes into BIRD 2, {rounds} rounds, speakers alternating"
    );
    println!(
        "A = routes handed to the running speaker (ours: announce_many; gobgpd: gobgp mrt inject) -> BIRD has all"
    );
    println!(
        "B = speaker already holds the routes; BIRD sees Established -> BIRD has all (initial transfer)"
    );
    println!("round  A_ours_ms  A_gobgpd_ms (inject CLI ms)  B_ours_ms  B_gobgpd_ms");
    let (mut ao, mut ag, mut bo, mut bg) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for r in 0..rounds {
        let a_o = measure_ours(&lab, &mut birdc, &ps, false)?;
        let (a_g, inj) = measure_gobgp(&mut lab, &mut birdc, routes, &mrt, false)?;
        let b_o = measure_ours(&lab, &mut birdc, &ps, true)?;
        let (b_g, _) = measure_gobgp(&mut lab, &mut birdc, routes, &mrt, true)?;
        println!(
            "{r:>5}  {:>9.1}  {:>11.1} ({:>7.1})  {:>9.1}  {:>11.1}",
            ms(a_o),
            ms(a_g),
            ms(inj),
            ms(b_o),
            ms(b_g)
        );
        ao.push(a_o);
        ag.push(a_g);
        bo.push(b_o);
        bg.push(b_g);
    }
    let (mao, mag, mbo, mbg) = (
        median(&mut ao),
        median(&mut ag),
        median(&mut bo),
        median(&mut bg),
    );
    println!(
        "median A: ours {:.1} ms, gobgpd {:.1} ms, gobgpd/ours = {:.1}x",
        ms(mao),
        ms(mag),
        ms(mag) / ms(mao)
    );
    println!(
        "median B: ours {:.1} ms, gobgpd {:.1} ms, gobgpd/ours = {:.1}x",
        ms(mbo),
        ms(mbg),
        ms(mbg) / ms(mbo)
    );
    Ok(())
}
