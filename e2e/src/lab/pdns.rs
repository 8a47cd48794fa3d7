//! PowerDNS (the Debian `pdns-server` with `pdns-backend-bind`) as the two-region
//! lab's global traffic manager: an authoritative server for `gtm.test` whose
//! `app.gtm.test` is a LUA record. The record uses `ifurlextup`: PowerDNS fetches each
//! region's per-VIP health URL on that region's edge
//! (`http://EDGE:9090/health/vip/VIP/80`) every [`CHECK_INTERVAL_S`] seconds and
//! answers with the VIPs whose URL returned 200 (`selector='all'`); when every region
//! is down it answers with all of them (its `backupSelector`). The probed address (the
//! edge) differs from the answered one (the VIP), which is what `ifurlextup` exists
//! for; `ifurlup` would fetch the URL from the answered address itself.
//!
//! Pure writers here ([`pdns_conf`], [`named_conf`], [`zone`]) and the running server
//! ([`PowerDns`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cmd::run_in;
use super::daemon::Daemon;
use super::{Error, Result, wait_for};

/// The zone PowerDNS serves.
pub const ZONE: &str = "gtm.test";
/// The name whose answer follows the regions' health.
pub const APP: &str = "app.gtm.test";
/// `lua-health-checks-interval`: seconds between two probes of one URL.
pub const CHECK_INTERVAL_S: u64 = 1;
/// TTL of the LUA record's answers (what a resolver may cache).
pub const TTL_S: u32 = 1;

/// One region as the GTM sees it: the VIP it answers with, the URL that says whether
/// that VIP is healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub vip: String,
    pub health_url: String,
}

impl Target {
    /// The per-VIP health URL of `edge`'s HTTP server (`port`) for `vip`:`svc_port`.
    pub fn new(vip: &str, edge: &str, port: u16, svc_port: u16) -> Target {
        Target {
            vip: vip.to_string(),
            health_url: health_url(edge, port, vip, svc_port),
        }
    }
}

/// `http://EDGE:PORT/health/vip/VIP/SVC_PORT` (the edge's per-VIP health endpoint).
pub fn health_url(edge: &str, port: u16, vip: &str, svc_port: u16) -> String {
    format!("http://{edge}:{port}/health/vip/{vip}/{svc_port}")
}

/// `pdns.conf`: the bind backend reading `dir/named.conf`, LUA records on, health
/// checks every [`CHECK_INTERVAL_S`] s, no packet or query cache (an answer must
/// follow the health at once), in the foreground, no privilege drop, the control
/// socket in `dir`.
pub fn pdns_conf(dir: &Path, listen: IpAddr) -> String {
    let d = dir.display();
    format!(
        "# PowerDNS as the lab's GTM (written by ringlb-lab)\n\
         launch=bind\n\
         bind-config={d}/named.conf\n\
         enable-lua-records=yes\n\
         lua-health-checks-interval={CHECK_INTERVAL_S}\n\
         local-address={listen}\n\
         local-port=53\n\
         socket-dir={d}\n\
         guardian=no\n\
         daemon=no\n\
         disable-syslog=yes\n\
         cache-ttl=0\n\
         query-cache-ttl=0\n\
         negquery-cache-ttl=0\n\
         loglevel=6\n"
    )
}

/// `named.conf` for the bind backend: the one zone, from `dir/ZONE.zone`.
pub fn named_conf(dir: &Path) -> String {
    format!(
        "zone \"{ZONE}\" {{ type native; file \"{}/{ZONE}.zone\"; }};\n",
        dir.display()
    )
}

/// The zone file: SOA, NS `ns.gtm.test` at `ns_ip`, and `app` as a LUA A record over
/// `targets` (see the module docs).
pub fn zone(ns_ip: IpAddr, targets: &[Target]) -> String {
    let pairs: Vec<String> = targets
        .iter()
        .map(|t| format!("['{}']='{}'", t.vip, t.health_url))
        .collect();
    format!(
        "$TTL {TTL_S}\n\
         @ IN SOA ns.{ZONE}. hostmaster.{ZONE}. 1 60 60 600 {TTL_S}\n\
         @ IN NS ns.{ZONE}.\n\
         ns IN A {ns_ip}\n\
         app IN LUA A \"ifurlextup({{{{{}}}}}, {{selector='all'}})\"\n",
        pairs.join(", ")
    )
}

/// The A records of `dig +short` output, sorted.
pub fn dig_addresses(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| l.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// A running `pdns_server` in a namespace.
#[derive(Debug)]
pub struct PowerDns {
    pub ns: String,
    pub listen: IpAddr,
    pub dir: PathBuf,
    pub daemon: Daemon,
}

impl PowerDns {
    /// Writes the configuration into `dir` (created) and starts `pdns_server` in
    /// namespace `ns`, listening on `listen`:53; waits until it answers the zone's SOA.
    /// Its log is `logs/pdns.log`.
    pub fn start(
        ns: &str,
        listen: IpAddr,
        dir: &Path,
        logs: &Path,
        targets: &[Target],
    ) -> Result<PowerDns> {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        for (name, text) in [
            ("pdns.conf".to_string(), pdns_conf(dir, listen)),
            ("named.conf".to_string(), named_conf(dir)),
            (format!("{ZONE}.zone"), zone(listen, targets)),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(Error::io(format!("writing {}", p.display())))?;
        }
        let conf = format!("--config-dir={}", dir.display());
        let daemon = Daemon::spawn(logs, "pdns", Some(ns), &["pdns_server", &conf], &[])?;
        let mut p = PowerDns {
            ns: ns.to_string(),
            listen,
            dir: dir.to_path_buf(),
            daemon,
        };
        wait_for(
            "PowerDNS to answer the SOA of gtm.test",
            Duration::from_secs(20),
            Duration::from_millis(100),
            || {
                p.daemon.check_alive()?;
                let out = p.dig_in(ns, ZONE, "SOA")?;
                Ok(if out.contains(&format!("ns.{ZONE}.")) {
                    Ok(())
                } else {
                    Err(out)
                })
            },
        )?;
        Ok(p)
    }

    /// `dig +short @LISTEN NAME TYPE` from namespace `from` (one try, 1 s timeout).
    pub fn dig_in(&self, from: &str, name: &str, qtype: &str) -> Result<String> {
        let server = format!("@{}", self.listen);
        run_in(
            from,
            &["dig", "+short", "+tries=1", "+time=1", &server, name, qtype],
        )
    }

    /// The sorted A records PowerDNS answers for [`APP`], asked from namespace `from`.
    pub fn app_addresses(&self, from: &str) -> Result<Vec<String>> {
        Ok(dig_addresses(&self.dig_in(from, APP, "A")?))
    }

    /// The command a person pastes to ask the same question.
    pub fn dig_shown(&self, from: &str) -> String {
        format!("ip netns exec {from} dig +short @{} {APP} A", self.listen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zone_probes_each_regions_edge_and_answers_its_vip() {
        let t = [
            Target::new("10.210.100.10", "10.210.0.11", 9090, 80),
            Target::new("10.220.100.10", "10.220.0.11", 9090, 80),
        ];
        let z = zone("10.230.2.53".parse().unwrap(), &t);
        assert!(z.contains(
            "app IN LUA A \"ifurlextup({{['10.210.100.10']='http://10.210.0.11:9090/health/vip/10.210.100.10/80', ['10.220.100.10']='http://10.220.0.11:9090/health/vip/10.220.100.10/80'}}, {selector='all'})\""
        ), "{z}");
        assert!(z.contains("ns IN A 10.230.2.53"));
        assert!(z.starts_with("$TTL 1\n"));
    }

    #[test]
    fn the_config_enables_lua_and_disables_caches() {
        let c = pdns_conf(Path::new("/d"), "10.230.2.53".parse().unwrap());
        for line in [
            "launch=bind",
            "bind-config=/d/named.conf",
            "enable-lua-records=yes",
            "lua-health-checks-interval=1",
            "local-address=10.230.2.53",
            "cache-ttl=0",
            "query-cache-ttl=0",
            "daemon=no",
        ] {
            assert!(c.lines().any(|l| l == line), "{line} in {c}");
        }
        assert_eq!(
            named_conf(Path::new("/d")),
            "zone \"gtm.test\" { type native; file \"/d/gtm.test.zone\"; };\n"
        );
    }

    #[test]
    fn dig_output_is_parsed_to_sorted_addresses() {
        assert_eq!(
            dig_addresses("10.220.100.10\n10.210.100.10\n"),
            ["10.210.100.10", "10.220.100.10"]
        );
        assert!(dig_addresses(";; connection timed out; no servers could be reached\n").is_empty());
    }
}
