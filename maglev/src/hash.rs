//! The fixed, documented hashes Maglev depends on. Every function here is part of the
//! on-the-wire contract between edges (and releases): changing any output changes which
//! backend a flow lands on. `maglev/testdata/maglev/golden.txt` freezes them.
//!
//! * [`flow_hash`]: MurmurHash3_x86_32, seed 0, over a 40-byte 5-tuple key. The same
//!   function is `ringlb_flow_hash()` in `xdp/bpf/flow_hash.h`.
//! * [`backend_offset_skip`]: SipHash-1-3 with two fixed 128-bit keys over the backend's
//!   identity (address octets followed by the port in network order).

use std::net::IpAddr;

const MURMUR_C1: u32 = 0xcc9e_2d51;
const MURMUR_C2: u32 = 0x1b87_3593;

#[inline(always)]
fn murmur_round(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(MURMUR_C1)
        .rotate_left(15)
        .wrapping_mul(MURMUR_C2);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

#[inline(always)]
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// MurmurHash3_x86_32 of `data` with `seed` (Austin Appleby's reference algorithm).
/// Used as the byte-level reference of [`flow_hash`] and checked against published vectors.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        h = murmur_round(h, u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, byte) in tail.iter().enumerate() {
            k |= u32::from(*byte) << (8 * i);
        }
        h ^= k
            .wrapping_mul(MURMUR_C1)
            .rotate_left(15)
            .wrapping_mul(MURMUR_C2);
    }
    // The reference takes the length as a 32-bit int; keys here are tiny.
    h ^= data.len() as u32;
    fmix32(h)
}

/// The 16 address bytes as they sit in a packet, read as four little-endian words (what
/// a little-endian CPU gets when it loads them as `__u32[4]`). IPv4 fills word 0.
pub fn addr_words(addr: IpAddr) -> [u32; 4] {
    let mut b = [0u8; 16];
    match addr {
        IpAddr::V4(a) => b[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => b.copy_from_slice(&a.octets()),
    }
    std::array::from_fn(|i| {
        u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
    })
}

/// The 40-byte key [`flow_hash`] hashes: `saddr[16] || daddr[16] || sport[2] || dport[2]
/// || proto || 0 0 0`, addresses and ports in network byte order.
pub fn flow_key(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> [u8; 40] {
    let mut key = [0u8; 40];
    for (i, w) in addr_words(src)
        .into_iter()
        .chain(addr_words(dst))
        .enumerate()
    {
        key[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    key[32..34].copy_from_slice(&sport.to_be_bytes());
    key[34..36].copy_from_slice(&dport.to_be_bytes());
    key[36] = proto;
    key
}

/// Exactly `ringlb_flow_hash()` from `flow_hash.h`: the address words and the port fields
/// as a little-endian CPU loads them from the packet (`sport_raw = u16::from_le_bytes(
/// [packet byte 0, packet byte 1])`, i.e. the network-order value, not byte-swapped).
#[inline]
pub fn flow_hash_words(
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    sport_raw: u16,
    dport_raw: u16,
    proto: u8,
) -> u32 {
    let mut h = 0u32;
    for &w in saddr.iter().chain(daddr.iter()) {
        h = murmur_round(h, w);
    }
    h = murmur_round(h, u32::from(sport_raw) | (u32::from(dport_raw) << 16));
    h = murmur_round(h, u32::from(proto));
    fmix32(h ^ 40)
}

/// The ONE flow hash that indexes a Maglev table: `slot = flow_hash(..) % M`.
///
/// `MurmurHash3_x86_32(flow_key(src, dst, sport, dport, proto), seed = 0)`. Ports are in
/// host order here; the key holds them in network order. No seed per edge, on purpose:
/// every edge must map a flow to the same slot.
#[inline]
pub fn flow_hash(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
    flow_hash_words(
        &addr_words(src),
        &addr_words(dst),
        u16::from_le_bytes(sport.to_be_bytes()),
        u16::from_le_bytes(dport.to_be_bytes()),
        proto,
    )
}

/// SipHash with `C` compression and `D` finalization rounds (Aumasson & Bernstein), keyed
/// with `key` (k0 = little-endian bytes 0..8, k1 = bytes 8..16), 64-bit output.
pub fn siphash<const C: usize, const D: usize>(key: &[u8; 16], data: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes([
        key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
    ]);
    let k1 = u64::from_le_bytes([
        key[8], key[9], key[10], key[11], key[12], key[13], key[14], key[15],
    ]);
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let mut blocks = data.chunks_exact(8);
    for b in &mut blocks {
        let m = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        v[3] ^= m;
        for _ in 0..C {
            round(&mut v);
        }
        v[0] ^= m;
    }
    let mut last = (data.len() as u64) << 56;
    for (i, byte) in blocks.remainder().iter().enumerate() {
        last |= u64::from(*byte) << (8 * i);
    }
    v[3] ^= last;
    for _ in 0..C {
        round(&mut v);
    }
    v[0] ^= last;
    v[2] ^= 0xff;
    for _ in 0..D {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// SipHash-1-3 key of the offset hash: the ASCII bytes `ringlb maglev of`.
pub const OFFSET_KEY: [u8; 16] = *b"ringlb maglev of";
/// SipHash-1-3 key of the skip hash: the ASCII bytes `ringlb maglev sk`.
pub const SKIP_KEY: [u8; 16] = *b"ringlb maglev sk";

/// A backend's identity bytes: its address octets (4 for IPv4, 16 for IPv6) followed by
/// its port in network order. The weight is not part of the identity.
pub fn backend_key(addr: IpAddr, port: u16) -> ([u8; 18], usize) {
    let mut k = [0u8; 18];
    let n = match addr {
        IpAddr::V4(a) => {
            k[..4].copy_from_slice(&a.octets());
            4
        }
        IpAddr::V6(a) => {
            k[..16].copy_from_slice(&a.octets());
            16
        }
    };
    k[n..n + 2].copy_from_slice(&port.to_be_bytes());
    (k, n + 2)
}

/// The backend's permutation in a table of prime size `m` (paper §3.4):
/// `offset = h1 % m`, `skip = h2 % (m - 1) + 1`, with `h1`/`h2` SipHash-1-3 of
/// [`backend_key`] under [`OFFSET_KEY`]/[`SKIP_KEY`].
pub fn backend_offset_skip(addr: IpAddr, port: u16, m: u32) -> (u32, u32) {
    let (k, len) = backend_key(addr, port);
    let h1 = siphash::<1, 3>(&OFFSET_KEY, &k[..len]);
    let h2 = siphash::<1, 3>(&SKIP_KEY, &k[..len]);
    let m = u64::from(m);
    // Both results are < m <= 2^20, so the casts are lossless.
    ((h1 % m) as u32, (h2 % (m - 1) + 1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published MurmurHash3_x86_32 vectors (SMHasher / Wikipedia).
    #[test]
    fn murmur3_reference_vectors() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"", 0xffff_ffff), 0x81f1_6f39);
        assert_eq!(murmur3_32(&[0, 0, 0, 0], 0), 0x2362_f9de);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65, 0x87], 0), 0xf55b_516b);
        assert_eq!(
            murmur3_32(&[0x21, 0x43, 0x65, 0x87], 0x5082_edee),
            0x2362_f9de
        );
        assert_eq!(murmur3_32(b"Hello, world!", 0x9747_b28c), 0x2488_4cba);
        assert_eq!(murmur3_32(b"aaaa", 0x9747_b28c), 0x5a97_808a);
        assert_eq!(murmur3_32(b"abc", 0), 0xb3dd_93fa);
    }

    /// SipHash-2-4 reference vectors from the SipHash paper (key 00..0f, message 00..n-1);
    /// the same code with C=1, D=3 is what the offset/skip hashes use.
    #[test]
    fn siphash_reference_vectors() {
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let msg: Vec<u8> = (0u8..16).collect();
        assert_eq!(siphash::<2, 4>(&key, &msg[..0]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash::<2, 4>(&key, &msg[..1]), 0x74f8_39c5_93dc_67fd);
        assert_eq!(siphash::<2, 4>(&key, &msg[..8]), 0x93f5_f579_9a93_2462);
        assert_eq!(siphash::<2, 4>(&key, &msg[..15]), 0xa129_ca61_49be_45e5);
    }

    /// std's SipHasher13 with zero keys is what `DefaultHasher::new()` is today; we only
    /// use it here to cross-check our SipHash-1-3 (never in production: not stable).
    #[test]
    fn siphash13_matches_std() {
        use std::hash::Hasher;
        for len in 0..40u8 {
            let data: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37)).collect();
            let mut h = std::hash::DefaultHasher::new();
            h.write(&data);
            assert_eq!(siphash::<1, 3>(&[0; 16], &data), h.finish(), "len {len}");
        }
    }

    #[test]
    fn flow_hash_is_murmur3_of_the_key() {
        let cases = [
            ("10.0.0.1", "10.0.0.2", 80, 12345, 6),
            ("2001:db8::1", "2001:db8::ff", 443, 65535, 17),
            ("0.0.0.0", "255.255.255.255", 0, 0, 0),
        ];
        for (s, d, sp, dp, p) in cases {
            let (s, d): (IpAddr, IpAddr) = (s.parse().unwrap(), d.parse().unwrap());
            assert_eq!(
                flow_hash(s, d, sp, dp, p),
                murmur3_32(&flow_key(s, d, sp, dp, p), 0)
            );
        }
    }

    #[test]
    fn flow_hash_depends_on_every_field() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let base = flow_hash(a, b, 1000, 80, 6);
        assert_ne!(base, flow_hash(b, a, 1000, 80, 6));
        assert_ne!(base, flow_hash(a, b, 1001, 80, 6));
        assert_ne!(base, flow_hash(a, b, 1000, 81, 6));
        assert_ne!(base, flow_hash(a, b, 1000, 80, 17));
    }

    #[test]
    fn offset_skip_in_range() {
        for m in [251u32, 65_537, 1_048_573] {
            for p in 0..200u16 {
                let (o, s) = backend_offset_skip(IpAddr::from([10, 0, 0, 1]), p, m);
                assert!(o < m);
                assert!((1..m).contains(&s));
            }
        }
    }

    #[test]
    fn v4_and_v6_identities_differ() {
        let (k4, n4) = backend_key("1.2.3.4".parse().unwrap(), 80);
        let (k6, n6) = backend_key("::ffff:1.2.3.4".parse().unwrap(), 80);
        assert_ne!(&k4[..n4], &k6[..n6]);
    }
}
