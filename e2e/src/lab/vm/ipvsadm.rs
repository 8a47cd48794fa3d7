//! Reading `ipvsadm` output in the IPVS lab: the real servers of a virtual
//! service, their weights, and a client's persistence templates.

/// `ADDR:PORT FORWARD WEIGHT` of each `->` line of `ipvsadm -Ln` (not the header).
pub fn parse_dests(ipvsadm: &str) -> Vec<String> {
    ipvsadm
        .lines()
        .filter_map(|l| l.trim().strip_prefix("->"))
        .map(|r| r.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|r| !r.starts_with("RemoteAddress"))
        .collect()
}

/// The destinations of the persistence templates of `client` for `virt` in
/// `ipvsadm -Lnc` (`pro expire state source virtual destination`): a template is
/// the entry whose source port is 0.
pub fn parse_templates(ipvsadm: &str, client: &str, virt: &str) -> Vec<String> {
    let src = format!("{client}:0");
    ipvsadm
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 6 && f[3] == src && f[4] == virt).then(|| f[5].to_string())
        })
        .collect()
}

/// The weight of real server `ip` in `ipvsadm -Ln` output, if listed.
pub fn dest_weight(ipvsadm: &str, ip: &str) -> Option<u32> {
    let want = format!("{ip}:");
    ipvsadm.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 6 && f[0] == "->" && f[1].starts_with(&want))
            .then(|| f[3].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_servers_weight_is_read_from_its_line() {
        let out = "TCP  10.210.100.10:80 mh persistent 600\n\
  -> 10.210.5.23:80               Tunnel  1      0          0\n\
  -> 10.210.4.22:80               Tunnel  0      3          0\n";
        assert_eq!(dest_weight(out, "10.210.4.22"), Some(0));
        assert_eq!(dest_weight(out, "10.210.5.23"), Some(1));
        assert_eq!(dest_weight(out, "10.210.5.2"), None);
    }

    #[test]
    fn ipvsadm_lists_real_servers_in_order() {
        let out = "IP Virtual Server version 1.2.1 (size=4096)\n\
Prot LocalAddress:Port Scheduler Flags\n\
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
TCP  10.210.100.10:80 mh (mh-fallback,mh-port)\n\
  -> 10.210.5.23:80               Tunnel  1      0          0\n\
  -> 10.210.4.22:80               Tunnel  1      3          0\n\
  -> 10.210.3.21:80               Tunnel  0      0          0\n";
        assert_eq!(
            parse_dests(out),
            [
                "10.210.5.23:80 Tunnel 1",
                "10.210.4.22:80 Tunnel 1",
                "10.210.3.21:80 Tunnel 0"
            ]
        );
    }

    #[test]
    fn ipvsadm_lists_the_templates_of_one_client() {
        let out = "IPVS connection entries\n\
pro expire state       source             virtual            destination\n\
TCP 09:58  NONE        10.210.200.2:0     10.210.100.10:80   10.210.4.22:80\n\
TCP 00:09  CLOSE       10.210.200.2:42001 10.210.100.10:80   10.210.4.22:80\n\
TCP 09:59  NONE        10.210.200.3:0     10.210.100.10:80   10.210.5.23:80\n\
TCP 09:59  NONE        10.210.200.2:0     10.210.100.11:80   10.210.3.21:80\n";
        assert_eq!(
            parse_templates(out, "10.210.200.2", "10.210.100.10:80"),
            ["10.210.4.22:80"]
        );
        assert!(parse_templates(out, "10.210.200.9", "10.210.100.10:80").is_empty());
    }
}
