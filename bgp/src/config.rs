//! Speaker configuration: per-peer session settings and export policy, route
//! attributes, and the standalone YAML file of `ringlb-edge speaker`.
//!
//! One description of a peer, [`PeerSpec`], from both ways in: the `BGPPeer` and
//! `BGPAdvertisement` objects (the edge agent's `peers` module turns a `BGPPeer`
//! into a [`PeerSpec`]) and the standalone file (whose peers are [`PeerSpec`]s).
//! Both end as the same [`PeerConfig`] through [`peer_from_spec`]; the FSM and
//! BFD take their own settings from that ([`crate::fsm::FsmConfig`],
//! [`BfdConfig`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnetwork::IpNetwork;
use serde::Deserialize;

use super::bfd::{BfdConfig, BfdSpec};
use super::codec::{Afi, Capability};
use super::gr::{GrCapability, OnSigterm, RestartState};
use super::{Error, invalid};

/// GRACEFUL_SHUTDOWN well-known community (RFC 8326).
pub const GRACEFUL_SHUTDOWN: u32 = 0xffff_0000;

/// Attributes the caller attaches to an announced prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RouteAttrs {
    pub communities: Vec<u32>,
    pub large_communities: Vec<[u32; 3]>,
    pub local_pref: Option<u32>,
    pub med: Option<u32>,
    /// Make the route less attractive (the VIP is below its health threshold). Applied
    /// after the export rules, so it wins over them.
    pub deprefer: Option<Deprefer>,
}

/// How an announced route is made less attractive than the same prefix from healthy
/// speakers: AS_PATH prepending (eBGP), a higher MED, a lower LOCAL_PREF (iBGP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deprefer {
    /// Extra copies of our ASN in AS_PATH, to eBGP peers only.
    pub prepend: u8,
    /// MED at least this high (the higher of this and the rules' MED).
    pub med: Option<u32>,
    /// LOCAL_PREF at most this high, to iBGP peers only.
    pub local_pref: Option<u32>,
}

impl Deprefer {
    /// The stronger of both on every attribute (several VIP:ports below their
    /// thresholds share one route).
    pub fn merge(self, o: Deprefer) -> Deprefer {
        let pick = |a: Option<u32>, b: Option<u32>, f: fn(u32, u32) -> u32| match (a, b) {
            (Some(x), Some(y)) => Some(f(x, y)),
            (x, y) => x.or(y),
        };
        Deprefer {
            prepend: self.prepend.max(o.prepend),
            med: pick(self.med, o.med, u32::max),
            local_pref: pick(self.local_pref, o.local_pref, u32::min),
        }
    }
}

/// One rule of a peer's export policy (one `BGPAdvertisement` selecting the peer).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExportRule {
    /// Prefixes this rule applies to (a route matches when one contains it). `None`
    /// means every route.
    pub prefixes: Option<Vec<IpNetwork>>,
    pub communities: Vec<u32>,
    pub large_communities: Vec<[u32; 3]>,
    pub local_pref: Option<u32>,
    pub med: Option<u32>,
    /// Announce the covering aggregate of this length instead of the host route.
    pub aggregate_v4: Option<u8>,
    pub aggregate_v6: Option<u8>,
}

/// What a peer is told. No rules: every route, with its own attributes. With rules:
/// only routes matched by at least one rule, with the rules' attributes added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExportPolicy {
    pub rules: Vec<ExportRule>,
}

/// Everything about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    pub address: IpAddr,
    pub port: u16,
    pub local_asn: u32,
    pub peer_asn: u32,
    pub router_id: Ipv4Addr,
    pub hold_time: u16,
    pub keepalive: u16,
    pub connect_retry: Duration,
    pub passive: bool,
    pub password: Option<String>,
    pub source_address: Option<IpAddr>,
    pub ebgp_multihop: Option<u8>,
    /// GTSM (RFC 5082): send TTL 255, require at least 256 - hops (see [`crate::ttl`]).
    pub ttl_security: bool,
    /// Graceful restart time advertised to the peer (RFC 4724); `None`: no GR.
    pub graceful_restart_time: Option<u16>,
    /// Next hop for IPv4 routes; default: the session's local address (next-hop self).
    pub next_hop_v4: Option<Ipv4Addr>,
    /// Next hop for IPv6 routes; default: the session's local address if it is IPv6.
    pub next_hop_v6: Option<Ipv6Addr>,
    pub families: Vec<Afi>,
    pub policy: ExportPolicy,
    /// BFD with this peer (None: off).
    pub bfd: Option<BfdConfig>,
}

impl PeerConfig {
    /// A session with `address`, port 179, from `local_asn` to `peer_asn`, with
    /// what a [`PeerSpec`] without the optional keys gets: hold time 90 s, the
    /// keepalive a third of it, a connect retry every 5 s, both families, every
    /// route exported; no password, multihop, GTSM, graceful restart or BFD.
    pub fn new(address: IpAddr, local_asn: u32, peer_asn: u32, router_id: Ipv4Addr) -> PeerConfig {
        PeerConfig {
            address,
            port: 179,
            local_asn,
            peer_asn,
            router_id,
            hold_time: 90,
            keepalive: 0,
            connect_retry: Duration::from_secs(5),
            passive: false,
            password: None,
            source_address: None,
            ebgp_multihop: None,
            ttl_security: false,
            graceful_restart_time: None,
            next_hop_v4: None,
            next_hop_v6: None,
            families: vec![Afi::Ipv4, Afi::Ipv6],
            policy: ExportPolicy::default(),
            bfd: None,
        }
    }

    pub fn is_ibgp(&self) -> bool {
        self.local_asn == self.peer_asn
    }

    /// The capabilities graceful restart adds to our OPEN to this peer: none when
    /// it has no restart time.
    pub fn gr_capabilities(&self, state: RestartState) -> Vec<Capability> {
        self.graceful_restart_time
            .map(|t| GrCapability::ours(t, &self.families, state).to_capability())
            .into_iter()
            .collect()
    }
}

/// One BGP peer as configuration states it, from the `BGPPeer` object to the
/// standalone file: the edge agent's `peers` module fills the session fields from
/// a `BGPPeer` and the password from its Secret; a peer of the standalone file is
/// this struct itself (the same keys as `BGPPeer` where both have the field, plus
/// the settings only the file has). Addresses are still text, so errors name the
/// field; [`peer_from_spec`] checks it into the [`PeerConfig`] the speaker runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerSpec {
    pub peer_address: String,
    #[serde(rename = "peerASN")]
    pub peer_asn: u32,
    #[serde(rename = "myASN")]
    pub my_asn: u32,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub hold_time: Option<u16>,
    #[serde(default)]
    pub keepalive_time: Option<u16>,
    #[serde(default)]
    pub ebgp_multihop: Option<u8>,
    #[serde(default)]
    pub source_address: Option<String>,
    /// BFD timers (`minRxMs`, `minTxMs`, `multiplier`); absent: no BFD.
    #[serde(default)]
    pub bfd: Option<BfdSpec>,
    /// GTSM (RFC 5082), `ttlSecurity`.
    #[serde(default)]
    pub ttl_security: bool,
    /// Graceful restart time (RFC 4724), `gracefulRestart.restartTime` of a
    /// `BGPPeer`; unset: no graceful restart.
    #[serde(default)]
    pub graceful_restart_time: Option<u16>,
    /// TCP MD5 password: a `BGPPeer`'s Secret, or the file's inline value.
    #[serde(default)]
    pub password: Option<String>,
    /// The standalone file only: a file holding the password (trailing newline
    /// stripped); [`SpeakerFile::check`] reads it into `password`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The standalone file only: wait for the peer to connect.
    #[serde(default)]
    pub passive: bool,
    /// The standalone file only; default 5.
    #[serde(default)]
    pub connect_retry_seconds: Option<u64>,
    /// The standalone file only: next hop for IPv4 routes; default the session's
    /// local address.
    #[serde(default)]
    pub next_hop_v4: Option<Ipv4Addr>,
    /// The standalone file only: next hop for IPv6 routes.
    #[serde(default)]
    pub next_hop_v6: Option<Ipv6Addr>,
    /// The standalone file only: `ipv4`, `ipv6`; default both.
    #[serde(default)]
    pub families: Option<Vec<String>>,
    /// The standalone file only: export rules; empty exports every prefix with
    /// its own attributes. (The edge agent passes the policy it builds from
    /// `BGPAdvertisement` objects to [`peer_from_spec`] instead.)
    #[serde(default)]
    pub advertisements: Vec<FileAdvertisement>,
}

/// Checks a [`PeerSpec`] into a [`PeerConfig`] with export policy `policy`. A
/// `passwordFile` must have been read into `password` by then.
pub fn peer_from_spec(
    spec: &PeerSpec,
    router_id: Ipv4Addr,
    policy: ExportPolicy,
) -> Result<PeerConfig, Error> {
    let address: IpAddr = spec.peer_address.parse().map_err(|_| {
        invalid(
            "peerAddress",
            format!("{:?} is not an IP address", spec.peer_address),
        )
    })?;
    if spec.peer_asn == 0 || spec.my_asn == 0 {
        return Err(invalid("peerASN/myASN", "AS number 0 is reserved"));
    }
    let hold_time = spec.hold_time.unwrap_or(90);
    if hold_time == 1 || hold_time == 2 {
        return Err(invalid("holdTime", "must be 0 or at least 3 seconds"));
    }
    let keepalive = spec.keepalive_time.unwrap_or(0);
    if hold_time > 0 && keepalive > hold_time {
        return Err(invalid("keepaliveTime", "must not exceed holdTime"));
    }
    let source_address = spec
        .source_address
        .as_deref()
        .map(|s| s.parse::<IpAddr>())
        .transpose()
        .map_err(|_| invalid("sourceAddress", "not an IP address"))?;
    if let Some(src) = source_address
        && src.is_ipv4() != address.is_ipv4()
    {
        return Err(invalid("sourceAddress", "family differs from peerAddress"));
    }
    if let Some(t) = spec.graceful_restart_time
        && !(1..=4095).contains(&t)
    {
        return Err(invalid("gracefulRestartTime", "must be 1..4095 seconds"));
    }
    if spec.password_file.is_some() {
        return Err(invalid("passwordFile", "not read into password"));
    }
    if let Some(p) = &spec.password
        && (p.is_empty() || p.len() > 80)
    {
        return Err(invalid("password", "TCP MD5 keys are 1..80 bytes"));
    }
    let families = spec
        .families
        .as_deref()
        .map(parse_families)
        .transpose()?
        .unwrap_or_else(|| vec![Afi::Ipv4, Afi::Ipv6]);
    Ok(PeerConfig {
        address,
        port: spec.port.unwrap_or(179),
        local_asn: spec.my_asn,
        peer_asn: spec.peer_asn,
        router_id,
        hold_time,
        keepalive,
        connect_retry: Duration::from_secs(spec.connect_retry_seconds.unwrap_or(5)),
        passive: spec.passive,
        password: spec.password.clone(),
        source_address,
        ebgp_multihop: spec.ebgp_multihop,
        ttl_security: spec.ttl_security,
        graceful_restart_time: spec.graceful_restart_time,
        next_hop_v4: spec.next_hop_v4,
        next_hop_v6: spec.next_hop_v6,
        families,
        policy,
        bfd: spec.bfd.as_ref().map(BfdConfig::from_spec).transpose()?,
    })
}

/// `ASN:VALUE` (each 0..65535), or the names `graceful-shutdown`, `no-export`,
/// `no-advertise`, `blackhole`.
pub fn parse_community(s: &str) -> Result<u32, Error> {
    let named = match s {
        "graceful-shutdown" => Some(GRACEFUL_SHUTDOWN),
        "blackhole" => Some(0xffff_029a),
        "no-export" => Some(0xffff_ff01),
        "no-advertise" => Some(0xffff_ff02),
        _ => None,
    };
    if let Some(c) = named {
        return Ok(c);
    }
    let numeric = s.split_once(':').and_then(|(asn, value)| {
        Some(u32::from(asn.parse::<u16>().ok()?) << 16 | u32::from(value.parse::<u16>().ok()?))
    });
    numeric.ok_or_else(|| {
        invalid(
            "communities",
            format!("{s:?} is not ASN:VALUE with both parts 0..65535"),
        )
    })
}

/// `GLOBAL:LOCAL1:LOCAL2`, each 0..4294967295 (RFC 8092).
pub fn parse_large_community(s: &str) -> Result<[u32; 3], Error> {
    let parts: Option<Vec<u32>> = s.split(':').map(|p| p.parse().ok()).collect();
    match parts.as_deref() {
        Some(&[global, local1, local2]) => Ok([global, local1, local2]),
        _ => Err(invalid(
            "largeCommunities",
            format!("{s:?} is not GLOBAL:LOCAL1:LOCAL2 with every part 0..4294967295"),
        )),
    }
}

/// Every entry of `list` through [`parse_community`]; the first error.
pub fn parse_communities(list: &[String]) -> Result<Vec<u32>, Error> {
    list.iter().map(|c| parse_community(c)).collect()
}

/// Every entry of `list` through [`parse_large_community`]; the first error.
pub fn parse_large_communities(list: &[String]) -> Result<Vec<[u32; 3]>, Error> {
    list.iter().map(|c| parse_large_community(c)).collect()
}

// ---------------------------------------------------------------- standalone file

/// The file given to `ringlb-edge speaker --config FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpeakerFile {
    /// BGP identifier of this speaker.
    pub router_id: Ipv4Addr,
    /// Port to accept sessions on (passive open); 0 turns listening off. Default 179.
    #[serde(default = "default_port")]
    pub listen_port: u16,
    /// Seconds between the GRACEFUL_SHUTDOWN re-announce and the withdrawal on SIGTERM.
    #[serde(default = "default_drain")]
    pub drain_seconds: u64,
    /// `drain` (default) or `restart` (hitless: no NOTIFICATION, nothing withdrawn).
    #[serde(default)]
    pub on_sigterm: OnSigterm,
    /// This start replaces a speaker that left with `onSigterm: restart` while the
    /// forwarding plane kept forwarding: graceful restart R and F bits set.
    #[serde(default)]
    pub forwarding_preserved: bool,
    pub peers: Vec<PeerSpec>,
    #[serde(default)]
    pub prefixes: Vec<FilePrefix>,
}

fn default_port() -> u16 {
    179
}
fn default_drain() -> u64 {
    5
}

/// `BGPAdvertisement` attributes, plus an optional prefix filter.
#[derive(Debug, Clone, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileAdvertisement {
    #[serde(default)]
    pub prefixes: Option<Vec<String>>,
    #[serde(default)]
    pub communities: Vec<String>,
    #[serde(default)]
    pub large_communities: Vec<String>,
    #[serde(default)]
    pub local_pref: Option<u32>,
    #[serde(default)]
    pub med: Option<u32>,
    #[serde(default)]
    pub aggregation_length_v4: Option<u8>,
    #[serde(default)]
    pub aggregation_length_v6: Option<u8>,
}

/// A prefix to announce at start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilePrefix {
    pub prefix: String,
    #[serde(default)]
    pub communities: Vec<String>,
    #[serde(default)]
    pub large_communities: Vec<String>,
    #[serde(default)]
    pub local_pref: Option<u32>,
    #[serde(default)]
    pub med: Option<u32>,
}

/// The parsed, checked standalone configuration.
#[derive(Debug, Clone)]
pub struct Standalone {
    pub listen_port: u16,
    pub drain: Duration,
    pub on_sigterm: OnSigterm,
    pub restart: RestartState,
    pub peers: Vec<PeerConfig>,
    pub prefixes: Vec<(IpNetwork, RouteAttrs)>,
}

pub fn export_rule(a: &FileAdvertisement) -> Result<ExportRule, Error> {
    Ok(ExportRule {
        prefixes: a
            .prefixes
            .as_ref()
            .map(|v| {
                v.iter()
                    .map(|p| parse_prefix(p, "prefixes"))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?,
        communities: parse_communities(&a.communities)?,
        large_communities: parse_large_communities(&a.large_communities)?,
        local_pref: a.local_pref,
        med: a.med,
        aggregate_v4: check_len(a.aggregation_length_v4, 32)?,
        aggregate_v6: check_len(a.aggregation_length_v6, 128)?,
    })
}

fn parse_prefix(s: &str, field: &str) -> Result<IpNetwork, Error> {
    let n: IpNetwork = s
        .parse()
        .map_err(|_| invalid(field, format!("{s:?} is not a prefix such as 192.0.2.1/32")))?;
    // Canonical form: host bits cleared.
    IpNetwork::new(n.network(), n.prefix()).map_err(|e| invalid(field, e.to_string()))
}

fn check_len(l: Option<u8>, max: u8) -> Result<Option<u8>, Error> {
    match l {
        Some(x) if x > max => Err(invalid("aggregationLength", format!("{x} > {max}"))),
        _ => Ok(l),
    }
}

fn parse_families(f: &[String]) -> Result<Vec<Afi>, Error> {
    f.iter()
        .map(|s| match s.as_str() {
            "ipv4" => Ok(Afi::Ipv4),
            "ipv6" => Ok(Afi::Ipv6),
            o => Err(invalid("families", format!("{o:?}: expected ipv4 or ipv6"))),
        })
        .collect()
}

impl SpeakerFile {
    pub fn load(path: &Path) -> Result<Standalone, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            what: format!("reading {}", path.display()),
            source: e,
        })?;
        let f: SpeakerFile = serde_yaml::from_str(&text)
            .map_err(|e| invalid(path.display().to_string(), e.to_string()))?;
        f.check()
    }

    pub fn check(self) -> Result<Standalone, Error> {
        let mut peers = Vec::new();
        for (i, p) in self.peers.iter().enumerate() {
            let ctx = |e: Error| match e {
                Error::Config { field, reason } => invalid(format!("peers[{i}].{field}"), reason),
                o => o,
            };
            let mut spec = p.clone();
            if let Some(file) = spec.password_file.take() {
                if spec.password.is_some() {
                    return Err(invalid(
                        format!("peers[{i}]"),
                        "password and passwordFile both set",
                    ));
                }
                spec.password = Some(
                    std::fs::read_to_string(&file)
                        .map_err(|e| Error::Io {
                            what: format!("reading passwordFile {}", file.display()),
                            source: e,
                        })?
                        .trim_end_matches(['\r', '\n'])
                        .to_string(),
                );
            }
            let policy = ExportPolicy {
                rules: p
                    .advertisements
                    .iter()
                    .map(export_rule)
                    .collect::<Result<_, _>>()
                    .map_err(ctx)?,
            };
            let pc = peer_from_spec(&spec, self.router_id, policy).map_err(ctx)?;
            if peers.iter().any(|q: &PeerConfig| q.address == pc.address) {
                return Err(invalid(format!("peers[{i}].peerAddress"), "duplicate peer"));
            }
            peers.push(pc);
        }
        let mut prefixes = Vec::new();
        for (i, p) in self.prefixes.iter().enumerate() {
            let ctx = |e: Error| match e {
                Error::Config { field, reason } => {
                    invalid(format!("prefixes[{i}].{field}"), reason)
                }
                o => o,
            };
            let attrs = RouteAttrs {
                communities: parse_communities(&p.communities).map_err(ctx)?,
                large_communities: parse_large_communities(&p.large_communities).map_err(ctx)?,
                local_pref: p.local_pref,
                med: p.med,
                deprefer: None,
            };
            prefixes.push((parse_prefix(&p.prefix, "prefix").map_err(ctx)?, attrs));
        }
        Ok(Standalone {
            listen_port: self.listen_port,
            drain: Duration::from_secs(self.drain_seconds),
            on_sigterm: self.on_sigterm,
            restart: RestartState {
                restarted: self.forwarding_preserved,
                forwarding: self.forwarding_preserved,
            },
            peers,
            prefixes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_without_optional_keys_is_the_plain_peer_config() {
        let spec = PeerSpec {
            peer_address: "10.0.0.1".into(),
            peer_asn: 65000,
            my_asn: 65011,
            ..Default::default()
        };
        let id = Ipv4Addr::new(10, 0, 0, 11);
        assert_eq!(
            peer_from_spec(&spec, id, ExportPolicy::default()).unwrap(),
            PeerConfig::new("10.0.0.1".parse().unwrap(), 65011, 65000, id)
        );
    }

    #[test]
    fn communities_parse_and_reject() {
        assert_eq!(parse_community("65535:0").unwrap(), GRACEFUL_SHUTDOWN);
        assert_eq!(
            parse_community("graceful-shutdown").unwrap(),
            GRACEFUL_SHUTDOWN
        );
        assert_eq!(parse_community("65011:100").unwrap(), 0xfdf3_0064);
        assert!(parse_community("65536:1").is_err());
        assert!(parse_community("1").is_err());
        assert_eq!(
            parse_large_community("4200000000:1:2").unwrap(),
            [4_200_000_000, 1, 2]
        );
        assert!(parse_large_community("1:2").is_err());
        assert!(parse_large_community("1:2:x").is_err());
    }

    #[test]
    fn standalone_file_parses_and_names_bad_fields() {
        let yaml = r#"
routerId: 10.200.0.11
drainSeconds: 2
peers:
  - peerAddress: 10.200.0.1
    peerASN: 65000
    myASN: 65011
    holdTime: 3
    password: s3cret
    families: [ipv4]
    advertisements:
      - communities: ["65011:100"]
        largeCommunities: ["65011:1:2"]
prefixes:
  - prefix: 10.200.100.1/32
    communities: ["65011:7"]
"#;
        let f: SpeakerFile = serde_yaml::from_str(yaml).unwrap();
        let s = f.check().unwrap();
        assert_eq!(s.listen_port, 179);
        assert_eq!(s.drain, Duration::from_secs(2));
        let p = &s.peers[0];
        assert_eq!(p.port, 179);
        assert_eq!(p.hold_time, 3);
        assert_eq!(p.families, vec![Afi::Ipv4]);
        assert_eq!(p.password.as_deref(), Some("s3cret"));
        assert_eq!(p.policy.rules[0].large_communities, vec![[65011, 1, 2]]);
        assert_eq!(s.prefixes[0].1.communities, vec![(65011 << 16) | 7]);

        let bad = yaml.replace("holdTime: 3", "holdTime: 2");
        let e = serde_yaml::from_str::<SpeakerFile>(&bad)
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("peers[0].holdTime"), "{e}");
        let unknown = yaml.replace("holdTime: 3", "holdTme: 3");
        assert!(serde_yaml::from_str::<SpeakerFile>(&unknown).is_err());
    }

    #[test]
    fn a_password_comes_inline_or_from_its_file_never_both() {
        let dir = std::env::temp_dir().join(format!("ringlb-bgp-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("md5");
        std::fs::write(&file, "fromfile\n").unwrap();
        let yaml = |extra: &str| {
            format!(
                "routerId: 10.0.0.11\npeers:\n  - peerAddress: 10.0.0.1\n    peerASN: 65000\n    \
                 myASN: 65011\n{extra}"
            )
        };
        let load = |y: String| serde_yaml::from_str::<SpeakerFile>(&y).unwrap().check();
        let from_file = load(yaml(&format!("    passwordFile: {}\n", file.display()))).unwrap();
        assert_eq!(from_file.peers[0].password.as_deref(), Some("fromfile"));
        let both = load(yaml(&format!(
            "    password: inline\n    passwordFile: {}\n",
            file.display()
        )))
        .unwrap_err();
        assert!(both.to_string().contains("both set"), "{both}");
        // the checked form never reads files: an unread passwordFile is refused
        let spec = PeerSpec {
            peer_address: "10.0.0.1".into(),
            peer_asn: 65000,
            my_asn: 65011,
            password_file: Some(file),
            ..Default::default()
        };
        let e = peer_from_spec(&spec, "10.0.0.11".parse().unwrap(), ExportPolicy::default())
            .unwrap_err();
        assert!(e.to_string().contains("passwordFile"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn standalone_file_takes_a_bfd_block_and_names_bad_fields() {
        let yaml = "routerId: 10.0.0.11\npeers:\n  - peerAddress: 10.0.0.1\n    peerASN: 65000\n    \
                    myASN: 65011\n    bfd: {minRxMs: 100, minTxMs: 50, multiplier: 4}\n";
        let f: SpeakerFile = serde_yaml::from_str(yaml).unwrap();
        let b = f.check().unwrap().peers[0].bfd.unwrap();
        assert_eq!(
            (b.min_rx, b.min_tx),
            (Duration::from_millis(100), Duration::from_millis(50))
        );
        assert_eq!(b.multiplier, 4);
        let bad = yaml.replace("minTxMs: 50", "minTxMs: 70000");
        let f: SpeakerFile = serde_yaml::from_str(&bad).unwrap();
        let e = f.check().unwrap_err();
        assert!(e.to_string().contains("peers[0].bfd.minTxMs"), "{e}");
        let unknown = yaml.replace("minRxMs", "minRx");
        assert!(serde_yaml::from_str::<SpeakerFile>(&unknown).is_err());
    }
}
