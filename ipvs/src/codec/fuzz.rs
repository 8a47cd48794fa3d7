//! Bounded mutation fuzzing of the decoders (cargo-fuzz needs nightly, which
//! CI does not have): valid messages of every kind, mutated by a seeded
//! generator (bit flips, byte sets, truncation, extension, length-field
//! tampering, splices), fed to `split` and the message decoders. They must never
//! panic, and whatever decodes must encode and decode again to the same value.
//! Set RINGLB_FUZZ_ITERS to run longer.

use std::net::IpAddr;

use super::consts::*;
use super::ipvs::Message;
use super::*;
use crate::model::{Dest, Forward, Proto, Service, ServiceKey, Stats};
use ringlb_testkit::fuzz::{Mutations, Rng};

const FAMILY: u16 = 0x25;

fn corpus() -> Vec<Vec<u8>> {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let k4 = ServiceKey {
        addr: ip("10.100.0.1"),
        port: 80,
        proto: Proto::Tcp,
    };
    let k6 = ServiceKey {
        addr: ip("fd00::1"),
        port: 53,
        proto: Proto::Udp,
    };
    let d4 = Dest::new(ip("10.1.0.7"), 80, Forward::Tunnel, 1);
    let d6 = Dest::new(ip("fd00:1::7"), 53, Forward::DirectRoute, 0);
    let mut dumped = Message::new_service(Service::mh(k4, 0x1a));
    dumped.stats = Some(Stats {
        conns: 1,
        inpkts: 2,
        outpkts: 3,
        inbytes: 4,
        outbytes: 5,
    });
    let mut msgs = vec![
        Message::new_service(Service::mh(k4, IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2)),
        Message::set_service(Service::mh(k6, IP_VS_SVC_F_SCHED2)),
        Message::del_service(k6),
        Message::get_services(),
        Message::new_dest(k4, d4.clone()),
        Message::set_dest(k6, d6.clone()),
        Message::del_dest(k4, d4.key),
        Message::get_dests(k6),
        dumped,
    ];
    let mut dest_dump = Message::new_dest(k4, d4);
    dest_dump.service = None;
    msgs.push(dest_dump);
    let mut c: Vec<Vec<u8>> = msgs.iter().map(|m| m.encode(FAMILY, 7)).collect();
    c.push(
        ctrl::Family {
            name: "IPVS".into(),
            id: FAMILY,
        }
        .encode(1),
    );
    c.push(addr::add(ip("10.100.0.1"), 1, 2));
    c.push(addr::add(ip("fd00::1"), 1, 3));
    c.push(addr::del(ip("10.100.0.1"), 1, 4));
    let local = addr::LocalAddr {
        addr: ip("10.100.0.1"),
        prefix_len: 32,
        ifindex: 1,
        label: Some(addr::LABEL.into()),
        flags: IFA_F_NOPREFIXROUTE,
    };
    c.push(local.encode(5));
    // Two messages in one datagram, then NLMSG_DONE.
    let mut two = c[8].clone(); // a dumped service and a dumped dest
    two.extend_from_slice(&c[9]);
    two.extend_from_slice(&[20, 0, 0, 0, 3, 0, 2, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    c.push(two);
    c
}

fn mutate(r: &mut Rng, seed: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    // Keep the nlmsghdr's length consistent half of the time, so the mutation
    // reaches the attribute decoders.
    let fix_length = |m: &mut Vec<u8>| {
        let fits = m.len() >= 16;
        if fits {
            let l = m.len() as u32;
            m[..4].copy_from_slice(&l.to_ne_bytes());
        }
        fits
    };
    // Tamper with an attribute length (at a 4-byte boundary).
    let tamper_length = |r: &mut Rng, m: &mut Vec<u8>| {
        let fits = m.len() > 24;
        if fits {
            let i = 20 + 4 * r.below((m.len() - 20) / 4);
            m[i] = m[i].wrapping_add([1, 255, 4, 252][r.below(4)]);
        }
        fits
    };
    let how = Mutations {
        interesting: &[0, 1, 2, 3, 4, 5, 8, 0x7f, 0x80, 0xff],
        max_append: 24,
        fill: 0,
        fix_length: &fix_length,
        tamper_length: &tamper_length,
    };
    ringlb_testkit::fuzz::mutate(r, seed, corpus, &how)
}

/// Decodes everything in `buf`; counts (decoded, refused).
fn feed(buf: &[u8]) -> (usize, usize) {
    let Ok(msgs) = split(buf) else {
        return (0, 1);
    };
    let (mut ok, mut err) = (0, 0);
    for m in msgs {
        let ty = m.ty;
        let decoded = match ty {
            FAMILY => Message::decode(&m.payload).map(|v| {
                let again = v.encode(FAMILY, 1);
                let back = Message::decode(&split(&again).unwrap()[0].payload);
                assert_eq!(back.as_ref(), Ok(&v), "re-encoding {v:?}");
            }),
            GENL_ID_CTRL => ctrl::Family::decode(&m.payload).map(drop),
            RTM_NEWADDR | RTM_DELADDR => addr::LocalAddr::decode(&m.payload).map(|a| {
                let back = addr::LocalAddr::decode(&split(&a.encode(1)).unwrap()[0].payload);
                assert_eq!(back.as_ref(), Ok(&a));
            }),
            _ => m.answer().map(drop),
        };
        match decoded {
            Ok(()) => ok += 1,
            Err(_) => err += 1,
        }
    }
    (ok, err)
}

#[test]
fn mutated_messages_never_panic_and_what_decodes_reencodes() {
    let iters: usize = std::env::var("RINGLB_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let corpus = corpus();
    for c in &corpus {
        assert_eq!(feed(c).1, 0, "the corpus decodes: {c:02x?}");
    }
    let mut r = Rng(0x1b5_5eed_0000_0013);
    let (mut ok, mut errs) = (0usize, 0usize);
    for i in 0..iters {
        let m = mutate(&mut r, &corpus[i % corpus.len()], &corpus);
        let (o, e) = feed(&m);
        ok += o;
        errs += e;
    }
    // The mutator must reach both outcomes, or it is not testing much.
    assert!(ok > iters / 20 && errs > iters / 20, "ok={ok} errs={errs}");
}

#[test]
fn random_bytes_never_panic() {
    let mut r = Rng(42);
    for _ in 0..50_000 {
        let len = r.below(96);
        let mut m: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
        if m.len() >= 20 && r.below(2) == 0 {
            let l = m.len() as u32;
            m[..4].copy_from_slice(&l.to_ne_bytes());
            m[4..6].copy_from_slice(&FAMILY.to_ne_bytes());
            m[16] = 1 + r.below(8) as u8;
        }
        feed(&m);
    }
}
