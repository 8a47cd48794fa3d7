//! Network-namespace lab for the BGP interop tests: a ToR namespace with a bridge,
//! edge namespaces hanging off it by veth, daemons (BIRD, gobgpd, our speaker binary)
//! started inside them. Everything it creates carries a unique prefix with the process
//! id, and the Drop guard kills every daemon and deletes every namespace, also when a
//! test fails. Nothing touches the caller's namespace.

#![allow(dead_code)]

pub(crate) mod frr;
pub(crate) mod poll;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

pub(crate) const TOR_V4: &str = "10.91.0.1";
pub(crate) const TOR_V6: &str = "fd91::1";

/// Edge `i` (1-based) addresses on the ToR segment.
pub(crate) fn edge_v4(i: u8) -> String {
    format!("10.91.0.{}", 10 + i)
}
pub(crate) fn edge_v6(i: u8) -> String {
    format!("fd91::{}", 10 + i)
}

/// Why the lab cannot run here, if it cannot.
pub(crate) fn skip_reason(tools: &[&str]) -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces)".into());
    }
    for t in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        if !found {
            return Some(format!(
                "{t} is not installed (scripts/setup.sh installs it)"
            ));
        }
    }
    None
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Why TCP MD5 cannot be tested here (the kernel has no TCP_MD5SIG), if it cannot.
pub(crate) fn md5_missing() -> Option<String> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e =
        ringlb_bgp::md5::set_md5_key(&probe, false, "127.0.0.2".parse().unwrap(), b"x").err()?;
    Some(format!("kernel has no TCP_MD5SIG: {e}"))
}

/// Skip the calling test loudly when the lab cannot run.
#[macro_export]
macro_rules! require_lab {
    ($($tool:expr),*) => {
        if let Some(why) = bgp_support::skip_reason(&["ip", $($tool),*]) {
            ringlb_testkit::tier::skip(format_args!("{}: {why}", module_path!()));
            return;
        }
    };
}

/// Skip the calling test loudly when the lab or FRR cannot run; `$tag` names it.
#[macro_export]
macro_rules! require_frr {
    ($tag:literal) => {
        $crate::require_lab!("vtysh");
        if let Some(why) = bgp_support::frr::missing() {
            ringlb_testkit::tier::skip(format_args!(concat!($tag, ": {}"), why));
            return;
        }
    };
}

/// Skip the calling test, saying so, when the kernel has no TCP MD5; `$what`
/// names it.
#[macro_export]
macro_rules! require_md5 {
    ($what:literal) => {
        if let Some(why) = bgp_support::md5_missing() {
            eprintln!(concat!("SKIPPED ", $what, ": {}"), why);
            return;
        }
    };
}

pub(crate) struct Daemon {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

pub(crate) struct Lab {
    pub prefix: String,
    pub dir: PathBuf,
    namespaces: Vec<String>,
    pub daemons: Vec<Daemon>,
}

pub(crate) fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn must(cmd: &str, args: &[&str]) -> String {
    run(cmd, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `ip -n <ns> <args>`, `args` split at white space (no argument here holds any).
fn ip_in(ns: &str, args: &str) {
    let argv: Vec<&str> = ["-n", ns]
        .into_iter()
        .chain(args.split_whitespace())
        .collect();
    must("ip", &argv);
}

impl Lab {
    /// A ToR namespace `tor` with bridge `br0` (TOR_V4/24, TOR_V6/64) and `edges`
    /// edge namespaces `e1..eN`, each with `eth0` on the bridge.
    pub(crate) fn new(tag: &str, edges: u8) -> Lab {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("rlbgp{}{}{}", std::process::id(), tag, n);
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).unwrap();
        let mut lab = Lab {
            prefix,
            dir,
            namespaces: Vec::new(),
            daemons: Vec::new(),
        };
        let tor = lab.add_ns("tor");
        ip_in(&tor, "link add br0 type bridge stp_state 0");
        ip_in(&tor, &format!("addr add {TOR_V4}/24 dev br0"));
        ip_in(&tor, &format!("addr add {TOR_V6}/64 dev br0 nodad"));
        ip_in(&tor, "link set br0 up");
        for i in 1..=edges {
            let e = lab.add_ns(&format!("e{i}"));
            let port = format!("ve{i}");
            ip_in(
                &tor,
                &format!("link add {port} type veth peer name eth0 netns {e}"),
            );
            ip_in(&tor, &format!("link set {port} master br0 up"));
            ip_in(&e, &format!("addr add {}/24 dev eth0", edge_v4(i)));
            ip_in(&e, &format!("addr add {}/64 dev eth0 nodad", edge_v6(i)));
            ip_in(&e, "link set eth0 up");
        }
        lab
    }

    fn add_ns(&mut self, short: &str) -> String {
        let name = format!("{}-{short}", self.prefix);
        must("ip", &["netns", "add", &name]);
        self.namespaces.push(name.clone());
        ip_in(&name, "link set lo up");
        name
    }

    pub(crate) fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub(crate) fn write(&self, file: &str, text: &str) -> PathBuf {
        let p = self.path(file);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Run a command inside namespace `short`.
    pub(crate) fn exec(&self, short: &str, cmd: &str, args: &[&str]) -> Result<String, String> {
        let ns = self.ns(short);
        let mut a = vec!["netns", "exec", ns.as_str(), cmd];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// Start a daemon in namespace `short`; output goes to DIR/NAME.log.
    pub(crate) fn spawn(&mut self, name: &str, short: &str, cmd: &Path, args: &[&str]) -> usize {
        let log = self.path(&format!("{name}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(short)])
            .arg(cmd)
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", cmd.display()));
        self.daemons.push(Daemon {
            name: name.to_string(),
            child,
            log,
        });
        self.daemons.len() - 1
    }

    /// `ip netns exec` execs the daemon, so the child's pid is the daemon's.
    pub(crate) fn signal(&self, idx: usize, sig: &str) {
        let pid = self.daemons[idx].child.id().to_string();
        must("kill", &[&format!("-{sig}"), &pid]);
    }

    /// SIGTERM daemon `idx` and wait (10 s at most) for it to exit.
    #[track_caller]
    pub(crate) fn terminate(&mut self, idx: usize) {
        self.signal(idx, "TERM");
        assert!(
            self.wait_exit(idx, Duration::from_secs(10)),
            "{} did not exit on SIGTERM",
            self.daemons[idx].name
        );
    }

    pub(crate) fn wait_exit(&mut self, idx: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.daemons[idx].child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    pub(crate) fn log(&self, idx: usize) -> String {
        std::fs::read_to_string(&self.daemons[idx].log).unwrap_or_default()
    }

    /// Every daemon's log, for failure messages.
    pub(crate) fn logs(&self) -> String {
        self.daemons
            .iter()
            .map(|d| {
                let t = std::fs::read_to_string(&d.log).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(40).collect();
                format!(
                    "--- {} ---\n{}\n",
                    d.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect()
    }

    // ---- BIRD

    /// Start BIRD in the ToR namespace with `protocols` appended to a base config that
    /// installs BGP routes into the kernel with ECMP (`merge paths`).
    pub(crate) fn start_bird(&mut self, protocols: &str) -> usize {
        let conf = format!(
            r#"log stderr all;
router id {TOR_V4};
protocol device {{ scan time 5; }}
protocol kernel kernel4 {{
  merge paths on limit 16; learn off; persist off;
  ipv4 {{ import none; export filter {{ if source = RTS_BGP then accept; reject; }}; }};
}}
protocol kernel kernel6 {{
  merge paths on limit 16; learn off; persist off;
  ipv6 {{ import none; export filter {{ if source = RTS_BGP then accept; reject; }}; }};
}}
template bgp edge {{
  direct; hold time 3; keepalive time 1; debug {{ states, routes }};
  connect delay time 1; connect retry time 1; error wait time 1, 2;
}}
{protocols}
"#
        );
        let c = self.write("bird.conf", &conf);
        let sock = self.path("bird.ctl");
        let (c, s) = (c.display().to_string(), sock.display().to_string());
        self.spawn(
            "bird",
            "tor",
            Path::new("bird"),
            &["-f", "-c", &c, "-s", &s],
        )
    }

    /// A lab `tag` of two edges, BIRD on the ToR with two plain eBGP protocols, e1
    /// (AS 65011) and e2 (AS 65012), for edges 1 and 2.
    pub(crate) fn with_bird_two_edges(tag: &str) -> Lab {
        let mut lab = Lab::new(tag, 2);
        lab.start_bird(&format!(
            r#"
protocol bgp e1 from edge {{ local {TOR_V4} as 65000; neighbor {} as 65011; ipv4 {{ import all; export none; }}; }}
protocol bgp e2 from edge {{ local {TOR_V4} as 65000; neighbor {} as 65012; ipv4 {{ import all; export none; }}; }}
"#,
            edge_v4(1),
            edge_v4(2)
        ));
        lab
    }

    pub(crate) fn birdc(&self, args: &[&str]) -> String {
        let sock = self.path("bird.ctl").display().to_string();
        let mut a = vec!["-s", sock.as_str()];
        a.extend_from_slice(args);
        self.exec("tor", "birdc", &a).unwrap_or_default()
    }

    // ---- our speaker

    pub(crate) fn start_speaker(&mut self, name: &str, short: &str, yaml: &str) -> usize {
        let cfg = self.write(&format!("{name}.yaml"), yaml);
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_ringlb-edge"));
        let c = cfg.display().to_string();
        self.spawn(
            name,
            short,
            &bin,
            &[
                "--metrics-addr",
                "127.0.0.1:0",
                "--log-level",
                "debug",
                "speaker",
                "--config",
                &c,
            ],
        )
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
        for ns in &self.namespaces {
            // Anything still running in the namespace was started by this lab.
            if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
                for p in pids.split_whitespace() {
                    let _ = run("kill", &["-9", p]);
                }
            }
            let _ = run("ip", &["netns", "del", ns]);
        }
        if std::env::var_os("RINGLB_KEEP_LAB").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Lab {
    /// The ToR's kernel route to `vip` (`ip route show`), empty if none.
    pub(crate) fn tor_route(&self, vip: &str) -> String {
        let fam = if vip.contains(':') { "-6" } else { "-4" };
        self.exec("tor", "ip", &[fam, "route", "show", vip])
            .unwrap_or_default()
    }

    /// Whether the ToR routes `vip` via both edge 1 and edge 2 (ECMP).
    pub(crate) fn routes_via_both_edges(&self, vip: &str) -> bool {
        let r = self.tor_route(vip);
        r.contains(&format!("via {}", edge_v4(1))) && r.contains(&format!("via {}", edge_v4(2)))
    }

    /// Whether BIRD's protocol `proto` (a session) is Established.
    pub(crate) fn bird_established(&self, proto: &str) -> bool {
        self.birdc(&["show", "protocols", proto])
            .contains("Established")
    }

    /// Waits up to `within` for BIRD's protocols `protos` to be Established; panics
    /// naming `what`, with BIRD's protocols and the logs, when they are not.
    #[track_caller]
    pub(crate) fn assert_established_within(&self, protos: &[&str], within: Duration, what: &str) {
        assert!(
            wait_until(within, || protos.iter().all(|p| self.bird_established(p))),
            "{what} not Established:\n{}\n{}",
            self.birdc(&["show", "protocols", "all"]),
            self.logs()
        );
    }

    /// Waits up to `within` for the ToR's route to `vip` to go through both edges;
    /// panics with `what`, the route and the logs when it does not.
    #[track_caller]
    pub(crate) fn assert_ecmp_within(&self, vip: &str, within: Duration, what: &str) {
        assert!(
            wait_until(within, || self.routes_via_both_edges(vip)),
            "{what}: {}\n{}",
            self.tor_route(vip),
            self.logs()
        );
    }

    /// Poll the ToR's route to `vip` every 5 ms, for at most `timeout`, until it no
    /// longer contains `via`: (the last route seen, the time from the call).
    pub(crate) fn wait_route_without(
        &self,
        vip: &str,
        via: &str,
        timeout: Duration,
    ) -> (String, Duration) {
        let t0 = Instant::now();
        let end = t0 + timeout;
        let mut r = self.tor_route(vip);
        while r.contains(via) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
            r = self.tor_route(vip);
        }
        (r, t0.elapsed())
    }
}

/// Poll `f` every 50 ms until it returns true or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
