//! The outer sources failover decapsulation accepts (`decap_senders`,
//! failover.h): the other region's edges, from `XdpOptions::decap_senders`.
//! The loader writes the whole set at every load, over whatever a pinned
//! earlier run left; empty, no IPIP packet to a VIP is decapsulated.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use aya::maps::{LpmTrie, MapData, lpm_trie::Key};

use crate::{Error, abi, map_err, maps::kernel::KernelMaps};

/// `(network, prefix length)` of each sender prefix, host bits cleared; a
/// prefix longer than 32 is a /32.
pub fn keys(senders: &[(Ipv4Addr, u8)]) -> BTreeSet<(u32, u8)> {
    senders
        .iter()
        .map(|&(a, len)| {
            let len = len.min(32);
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            (u32::from(a) & mask, len)
        })
        .collect()
}

/// Makes `decap_senders` hold exactly `senders`.
pub fn write(maps: &mut KernelMaps, senders: &[(Ipv4Addr, u8)]) -> Result<(), Error> {
    let want = keys(senders);
    if want.len() > abi::MAX_DECAP_SENDERS as usize {
        return Err(Error::InvalidService {
            vip: "failover senders".into(),
            reason: format!(
                "{} prefixes, at most {} fit",
                want.len(),
                abi::MAX_DECAP_SENDERS
            ),
        });
    }
    let name = abi::map::DECAP_SENDERS;
    let mut trie: LpmTrie<&mut MapData, u32, u8> = maps.map_mut(name)?;
    // the trie's data is the address as the packet holds it (big-endian)
    let have: Vec<Key<u32>> = trie
        .keys()
        .collect::<Result<_, _>>()
        .map_err(map_err(name))?;
    for k in have {
        if !want.contains(&(u32::from_be(k.data()), k.prefix_len() as u8)) {
            trie.remove(&k).map_err(map_err(name))?;
        }
    }
    for &(net, len) in &want {
        let k = Key::new(u32::from(len), net.to_be());
        trie.insert(&k, 1, 0).map_err(map_err(name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bits_are_cleared_and_duplicates_merge() {
        let k = keys(&[
            (Ipv4Addr::new(192, 0, 2, 77), 24),
            (Ipv4Addr::new(192, 0, 2, 1), 24),
            (Ipv4Addr::new(198, 51, 100, 7), 40),
        ]);
        let want: BTreeSet<(u32, u8)> = [
            (u32::from(Ipv4Addr::new(192, 0, 2, 0)), 24),
            (u32::from(Ipv4Addr::new(198, 51, 100, 7)), 32),
        ]
        .into_iter()
        .collect();
        assert_eq!(k, want);
    }
}
