//! Any bytes into the BFD Control packet decoder: it must never panic, and what it
//! accepts must encode and decode to the same packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringlb_bgp::bfd::packet::decode;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = decode(data) {
        assert_eq!(decode(&c.encode()), Ok(c));
    }
});
