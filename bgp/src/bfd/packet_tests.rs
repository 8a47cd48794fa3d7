//! Byte fixtures both ways, every drop reason, and a bounded mutation fuzz of
//! [`decode`] (RINGLB_FUZZ_ITERS for more iterations).

use super::*;

use ringlb_testkit::fuzz::{Mutations, Rng, mutate};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Down, no diagnostic, your discriminator not known yet, 1 s / 300 ms.
const DOWN: [u8; 24] = [
    0x20, 0x40, 0x03, 0x18, // v1 diag 0 | Down | mult 3 | len 24
    0x00, 0x00, 0x00, 0x2a, // my disc 42
    0x00, 0x00, 0x00, 0x00, // your disc 0
    0x00, 0x0f, 0x42, 0x40, // desired min tx 1,000,000 us
    0x00, 0x04, 0x93, 0xe0, // required min rx 300,000 us
    0x00, 0x00, 0x00, 0x00, // echo 0
];

/// Up with Poll, 100 ms both ways, multiplier 3.
const UP_POLL: [u8; 24] = [
    0x20, 0xe0, 0x03, 0x18, // v1 diag 0 | Up + P | mult 3 | len 24
    0x00, 0x00, 0x00, 0x2a, // my disc 42
    0xde, 0xad, 0xbe, 0xef, // your disc
    0x00, 0x01, 0x86, 0xa0, // 100,000 us
    0x00, 0x01, 0x86, 0xa0, // 100,000 us
    0x00, 0x00, 0x00, 0x00,
];

/// Down with diagnostic 1 (detection time expired), Final bit.
const DOWN_DIAG_FINAL: [u8; 24] = [
    0x21, 0x50, 0x05, 0x18, // v1 diag 1 | Down + F | mult 5 | len 24
    0x00, 0x00, 0x00, 0x07, //
    0x00, 0x00, 0x00, 0x09, //
    0x00, 0x00, 0x27, 0x10, // 10 ms
    0x00, 0x00, 0x27, 0x10, // 10 ms
    0x00, 0x00, 0x00, 0x00,
];

fn fixtures() -> Vec<(&'static [u8; 24], Control)> {
    let base = Control {
        diag: Diag::None,
        state: State::Down,
        poll: false,
        fin: false,
        cpi: false,
        demand: false,
        detect_mult: 3,
        my_disc: 42,
        your_disc: 0,
        desired_min_tx: ms(1000),
        required_min_rx: ms(300),
        required_min_echo_rx: Duration::ZERO,
    };
    vec![
        (&DOWN, base),
        (
            &UP_POLL,
            Control {
                state: State::Up,
                poll: true,
                your_disc: 0xdead_beef,
                desired_min_tx: ms(100),
                required_min_rx: ms(100),
                ..base
            },
        ),
        (
            &DOWN_DIAG_FINAL,
            Control {
                diag: Diag::DetectionTimeExpired,
                fin: true,
                detect_mult: 5,
                my_disc: 7,
                your_disc: 9,
                desired_min_tx: ms(10),
                required_min_rx: ms(10),
                ..base
            },
        ),
    ]
}

#[test]
fn fixtures_decode_and_encode_both_ways() {
    for (bytes, want) in fixtures() {
        assert_eq!(decode(bytes).unwrap(), want);
        assert_eq!(&want.encode(), bytes);
    }
}

#[test]
fn longer_payload_than_length_is_accepted() {
    let mut b = UP_POLL.to_vec();
    b.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(decode(&b).unwrap().your_disc, 0xdead_beef);
}

#[test]
fn every_check_of_rfc5880_6_8_6_drops() {
    let with = |i: usize, v: u8| {
        let mut b = UP_POLL;
        b[i] = v;
        b
    };
    let cases: Vec<(Vec<u8>, DecodeError)> = vec![
        (UP_POLL[..23].to_vec(), DecodeError::Short(23)),
        (with(0, 0x40).to_vec(), DecodeError::Version(2)),
        (
            with(3, 23).to_vec(),
            DecodeError::Length { field: 23, got: 24 },
        ),
        (
            with(3, 25).to_vec(),
            DecodeError::Length { field: 25, got: 24 },
        ),
        (
            {
                let mut b = with(1, 0xc4).to_vec();
                b[3] = 26;
                b.extend_from_slice(&[1, 2]);
                b
            },
            DecodeError::Auth,
        ),
        (with(2, 0).to_vec(), DecodeError::ZeroMultiplier),
        (with(1, 0xc1).to_vec(), DecodeError::Multipoint),
        (
            {
                let mut b = UP_POLL;
                b[4..8].fill(0);
                b.to_vec()
            },
            DecodeError::ZeroMyDisc,
        ),
        (
            {
                let mut b = UP_POLL;
                b[8..12].fill(0);
                b.to_vec()
            },
            DecodeError::ZeroYourDisc("Up"),
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(decode(&bytes), Err(want), "{bytes:02x?}");
        assert!(!want.metric_label().is_empty());
    }
}

#[test]
fn fuzz_decode_never_panics_and_round_trips() {
    let iters: usize = std::env::var("RINGLB_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let corpus: Vec<Vec<u8>> = [DOWN, UP_POLL, DOWN_DIAG_FINAL]
        .iter()
        .map(|b| b.to_vec())
        .collect();
    let fix_length = |m: &mut Vec<u8>| {
        let fits = m.len() >= 4 && m.len() < 256;
        if fits {
            m[3] = m.len() as u8;
        }
        fits
    };
    let tamper_length = |r: &mut Rng, m: &mut Vec<u8>| {
        let fits = m.len() >= 4;
        if fits {
            m[3] = m[3].wrapping_add([1, 255, 2, 254][r.below(4)]);
        }
        fits
    };
    let how = Mutations {
        interesting: &[0, 1, 0x18, 0x20, 0x40, 0x80, 0xc0, 0xff],
        max_append: 16,
        fill: 0x20,
        fix_length: &fix_length,
        tamper_length: &tamper_length,
    };
    let mut r = Rng(0x5eed_bfd0_0000_0001);
    let mut accepted = 0;
    for _ in 0..iters {
        let seed = &corpus[r.below(corpus.len())];
        let m = mutate(&mut r, seed, &corpus, &how);
        if let Ok(c) = decode(&m) {
            accepted += 1;
            // What we accept re-encodes to the same first 24 bytes, up to the
            // flag bits we do not keep (A and M are rejected; length is normalised)
            // and interval precision (microseconds survive exactly).
            let again = decode(&c.encode()).unwrap();
            assert_eq!(again, c, "{m:02x?}");
        }
    }
    assert!(
        accepted > iters / 100,
        "only {accepted} of {iters} accepted"
    );
}
