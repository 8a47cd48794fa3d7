//! Bounded mutation fuzzing of the receive path (cargo-fuzz needs nightly, which CI
//! does not have): valid messages of every kind, mutated by a seeded generator (bit
//! flips, byte sets, truncation, extension, length-field tampering, splices), fed to
//! `decode`. It must never panic, and every error must be a NOTIFICATION the RFCs
//! define for a received message. Set RINGLB_FUZZ_ITERS to run longer.

use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::IpNetwork;

use super::*;

use ringlb_testkit::fuzz::{Mutations, Rng};

fn corpus() -> Vec<Vec<u8>> {
    let mut c = Vec::new();
    let open = Open::new(
        65011,
        3,
        Ipv4Addr::new(10, 0, 0, 1),
        &[Afi::Ipv4, Afi::Ipv6],
    );
    c.push(Message::Open(open).encode().unwrap());
    c.push(Message::Keepalive.encode().unwrap());
    c.push(
        Message::Notification(Notification::with_data(6, 2, b"\x04bye!".to_vec()))
            .encode()
            .unwrap(),
    );
    c.push(Message::RouteRefresh { afi: 1, safi: 1 }.encode().unwrap());
    let a4 = PathAttrs {
        as_path: vec![65011, 4_200_000_000],
        next_hop: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 11))),
        med: Some(5),
        local_pref: Some(100),
        communities: vec![1, 0xffff_0000],
        large_communities: vec![[1, 2, 3]],
        ..Default::default()
    };
    let n4: Vec<IpNetwork> = ["10.1.0.1/32", "10.2.0.0/16", "0.0.0.0/0"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    c.extend(encode_updates(&n4[..1], Some((&a4, &n4)), true).unwrap());
    c.extend(encode_updates(&[], Some((&a4, &n4)), false).unwrap());
    let mut a6 = a4.clone();
    a6.next_hop = Some("fd00::11".parse().unwrap());
    let n6: Vec<IpNetwork> = ["fd00:1::1/128", "fd00::/8"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    c.extend(encode_updates(&n6, Some((&a6, &n6)), true).unwrap());
    c.push(end_of_rib(Afi::Ipv6).unwrap());
    c
}

fn mutate(r: &mut Rng, seed: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    // Keep the header consistent with the new length half of the time, so the
    // mutation reaches the body decoders.
    let fix_length = |m: &mut Vec<u8>| {
        let fits = m.len() >= 19;
        if fits {
            let l = m.len() as u16;
            m[16..18].copy_from_slice(&l.to_be_bytes());
        }
        fits
    };
    // Tamper with an inner length field (withdrawn / attribute lengths).
    let tamper_length = |r: &mut Rng, m: &mut Vec<u8>| {
        let fits = m.len() > 23;
        if fits {
            let i = 19 + r.below(m.len() - 19);
            m[i] = m[i].wrapping_add([1, 255, 2, 254][r.below(4)]);
        }
        fits
    };
    let how = Mutations {
        interesting: &[0, 1, 0x7f, 0x80, 0xff, 32, 33, 128, 129],
        max_append: 40,
        fill: 0xff,
        fix_length: &fix_length,
        tamper_length: &tamper_length,
    };
    ringlb_testkit::fuzz::mutate(r, seed, corpus, &how)
}

fn check_error(e: &CodecError, input: &[u8]) {
    let n = e.notification();
    let ok = match n.code {
        notif::HEADER => (1..=3).contains(&n.subcode),
        notif::OPEN => matches!(n.subcode, 0..=4 | 6),
        notif::UPDATE => matches!(n.subcode, 1..=11),
        _ => false,
    };
    assert!(
        ok,
        "decode error {e} maps to NOTIFICATION {n:?} for input {input:02x?}"
    );
}

#[test]
fn mutated_messages_never_panic_and_errors_are_rfc_notifications() {
    let iters: usize = std::env::var("RINGLB_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150_000);
    let corpus = corpus();
    let mut r = Rng(0x5eed_1234_abcd_0001);
    let (mut ok, mut errs) = (0usize, 0usize);
    for i in 0..iters {
        let seed = &corpus[i % corpus.len()];
        let m = mutate(&mut r, seed, &corpus);
        for four in [true, false] {
            match decode(&m, four) {
                Ok(Decoded::Message(msg)) => {
                    ok += 1;
                    // Whatever decodes must encode again without panicking.
                    let _ = msg.encode();
                }
                Ok(Decoded::Update(u)) => {
                    ok += 1;
                    if u.treat_as_withdraw.is_none() {
                        assert!(u.update.attrs.is_some() || u.update.nlri.is_empty());
                    }
                }
                Err(e) => {
                    errs += 1;
                    check_error(&e, &m);
                }
            }
        }
    }
    // The mutator must exercise both outcomes, or it is not testing much.
    assert!(ok > iters / 20 && errs > iters / 20, "ok={ok} errs={errs}");
}

#[test]
fn random_bytes_never_panic() {
    let mut r = Rng(42);
    for _ in 0..50_000 {
        let len = r.below(80);
        let mut m: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
        if r.below(2) == 0 && m.len() >= 19 {
            m[..16].fill(0xff);
            let l = m.len() as u16;
            m[16..18].copy_from_slice(&l.to_be_bytes());
            m[18] = 1 + r.below(5) as u8;
        }
        if let Err(e) = decode(&m, true) {
            check_error(&e, &m);
        }
    }
}
