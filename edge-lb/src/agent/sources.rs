//! The outer source addresses of the encapsulation: the flags, else the node's own
//! addresses (`--host-ips`, which the chart fills from the pod's `status.hostIPs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::RunArgs;

impl RunArgs {
    /// --source-v4, else this node's IPv4 address from --host-ips.
    pub(super) fn src4(&self) -> Option<Ipv4Addr> {
        self.source_v4.or_else(|| {
            self.host_ips.iter().find_map(|ip| match ip {
                IpAddr::V4(a) => Some(*a),
                IpAddr::V6(_) => None,
            })
        })
    }

    /// --source-v6, else this node's global IPv6 address from --host-ips.
    pub(super) fn src6(&self) -> Option<Ipv6Addr> {
        self.source_v6.or_else(|| {
            self.host_ips.iter().find_map(|ip| match ip {
                IpAddr::V6(a) if !a.is_unicast_link_local() => Some(*a),
                _ => None,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    fn run_args(argv: &[&str]) -> RunArgs {
        use clap::Parser;
        Flags::try_parse_from(
            ["run", "--node-name", "n1"]
                .into_iter()
                .chain(argv.iter().copied()),
        )
        .unwrap()
        .run
    }

    #[test]
    fn the_outer_sources_come_from_the_flags_else_from_the_nodes_addresses() {
        let a = run_args(&["--host-ips", "172.31.0.11,fe80::1,fd00:31::11"]);
        assert_eq!(a.src4(), Some(Ipv4Addr::new(172, 31, 0, 11)));
        assert_eq!(a.src6(), Some("fd00:31::11".parse().unwrap()));
        let a = run_args(&[
            "--host-ips",
            "172.31.0.11,fd00:31::11",
            "--source-v6",
            "2001:db8::1",
        ]);
        assert_eq!(a.src6(), Some("2001:db8::1".parse().unwrap()));
        // a single-stack IPv4 node: no IPv6 source, as before
        let a = run_args(&["--host-ips", "172.31.0.11"]);
        assert_eq!(a.src6(), None);
        assert_eq!(run_args(&[]).src4(), None);
    }
}
