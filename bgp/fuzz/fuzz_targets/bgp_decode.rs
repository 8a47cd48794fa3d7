//! Any bytes into the BGP decoder: it must never panic, and every error must map to
//! a NOTIFICATION of the header, OPEN or UPDATE class (RFC 4271 §6).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringlb_bgp::codec::{Decoded, decode};

fuzz_target!(|data: &[u8]| {
    for four_octet in [true, false] {
        match decode(data, four_octet) {
            Ok(Decoded::Message(m)) => {
                let _ = m.encode();
            }
            Ok(Decoded::Update(_)) => {}
            Err(e) => assert!((1..=3).contains(&e.notification().code), "{e}"),
        }
    }
});
