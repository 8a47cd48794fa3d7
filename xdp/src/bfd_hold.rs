//! BFD held by the datapath across a hitless agent restart: the `bfd_hold` map
//! (abi.h) and what the program does with it (`bpf/bfd_hold.h`).
//!
//! ```text
//!  old agent, restart exit ── write(HeldSession) ──> bfd_hold (pinned)
//!                                                      │ the program answers the
//!                                                      │ peer's Control packets, Up,
//!                                                      │ until deadline (XDP_TX)
//!  new agent, BFD start ──── held() / remove() <───────┘
//! ```
//!
//! [`HeldSession`] is the plain value; [`BfdHoldMap`] reads and writes the map,
//! pinned (`open_pinned`, the agent) or of a loaded object (`XdpDatapath::bfd_hold`,
//! tests). Deadlines are CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns`.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use aya::maps::{HashMap, Map, MapData};

use super::abi::{self, Be16, Be32, BfdHold, BfdHoldKey};
use super::{BpfError, Error, map_err};

const NAME: &str = abi::map::BFD_HOLD;

/// One held session: what the program answers with, and what the next agent
/// resumes from. Intervals are whole microseconds on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldSession {
    pub local: Ipv4Addr,
    pub peer: Ipv4Addr,
    pub my_disc: u32,
    pub your_disc: u32,
    pub min_tx: Duration,
    pub min_rx: Duration,
    pub detect_mult: u8,
    pub peer_min_tx: Duration,
    pub peer_min_rx: Duration,
    pub peer_mult: u8,
    /// The UDP source port the agent sent from.
    pub src_port: u16,
    /// CLOCK_MONOTONIC time after which the program stops answering.
    pub deadline: Duration,
}

/// A held session as read back, with the program's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldEntry {
    pub session: HeldSession,
    /// Packets the program answered.
    pub answered: u64,
    /// The peer's packets it did not answer (passed to the kernel).
    pub refused: u32,
    /// CLOCK_MONOTONIC time of the last answer.
    pub last_answer: Option<Duration>,
}

fn us(d: Duration) -> Be32 {
    Be32::from_host(u32::try_from(d.as_micros()).unwrap_or(u32::MAX))
}

fn dur(v: Be32) -> Duration {
    Duration::from_micros(u64::from(v.to_host()))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl HeldSession {
    pub fn key(&self) -> BfdHoldKey {
        BfdHoldKey::new(self.local, self.peer)
    }

    /// The map value (counters zero).
    pub fn value(&self) -> BfdHold {
        BfdHold {
            deadline_ns: nanos(self.deadline),
            my_disc: Be32::from_host(self.my_disc),
            your_disc: Be32::from_host(self.your_disc),
            min_tx_us: us(self.min_tx),
            min_rx_us: us(self.min_rx),
            peer_min_tx_us: us(self.peer_min_tx),
            peer_min_rx_us: us(self.peer_min_rx),
            src_port: Be16::from_host(self.src_port),
            detect_mult: self.detect_mult,
            peer_mult: self.peer_mult,
            ..Default::default()
        }
    }
}

impl HeldEntry {
    pub fn from_map(k: &BfdHoldKey, v: &BfdHold) -> HeldEntry {
        HeldEntry {
            session: HeldSession {
                local: k.local(),
                peer: k.peer(),
                my_disc: v.my_disc.to_host(),
                your_disc: v.your_disc.to_host(),
                min_tx: dur(v.min_tx_us),
                min_rx: dur(v.min_rx_us),
                detect_mult: v.detect_mult,
                peer_min_tx: dur(v.peer_min_tx_us),
                peer_min_rx: dur(v.peer_min_rx_us),
                peer_mult: v.peer_mult,
                src_port: v.src_port.to_host(),
                deadline: Duration::from_nanos(v.deadline_ns),
            },
            answered: v.answered,
            refused: v.refused,
            last_answer: (v.last_ns != 0).then(|| Duration::from_nanos(v.last_ns)),
        }
    }

    /// Whether the program still answers at `now` (CLOCK_MONOTONIC).
    pub fn live(&self, now: Duration) -> bool {
        now < self.session.deadline
    }
}

/// CLOCK_MONOTONIC now, the clock of the deadlines.
#[allow(unsafe_code)] // clock_gettime(2): std's Instant hides the raw value
pub fn monotonic_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The `bfd_hold` map.
pub struct BfdHoldMap {
    map: HashMap<MapData, BfdHoldKey, BfdHold>,
}

impl BfdHoldMap {
    /// The map a (running or stopped) edge pinned in `dir`; `Ok(None)` when
    /// there is none (a release without it, or never started).
    pub fn open_pinned(dir: &Path) -> Result<Option<BfdHoldMap>, Error> {
        let path = dir.join(NAME);
        if !path.exists() {
            return Ok(None);
        }
        let data = MapData::from_pin(&path).map_err(map_err(NAME))?;
        Self::from_data(data).map(Some)
    }

    /// An independent handle on a loaded object's map (by id).
    pub(crate) fn of_loaded(ebpf: &aya::Ebpf) -> Result<BfdHoldMap, Error> {
        let Some(Map::HashMap(data)) = ebpf.map(NAME) else {
            return Err(BpfError::Missing { name: NAME }.into());
        };
        let id = data.info().map_err(map_err(NAME))?.id();
        Self::from_data(MapData::from_id(id).map_err(map_err(NAME))?)
    }

    fn from_data(data: MapData) -> Result<BfdHoldMap, Error> {
        let map = HashMap::try_from(Map::HashMap(data)).map_err(map_err(NAME))?;
        Ok(BfdHoldMap { map })
    }

    /// Writes (or replaces) one held session, its counters zero.
    pub fn write(&mut self, s: &HeldSession) -> Result<(), Error> {
        self.map
            .insert(s.key(), s.value(), 0)
            .map_err(map_err(NAME))
    }

    /// Every entry, live or not.
    pub fn entries(&self) -> Result<Vec<HeldEntry>, Error> {
        let mut v = Vec::new();
        for kv in self.map.iter() {
            let (k, val) = kv.map_err(map_err(NAME))?;
            v.push(HeldEntry::from_map(&k, &val));
        }
        Ok(v)
    }

    /// The entry of (local, peer), if any.
    pub fn get(&self, local: Ipv4Addr, peer: Ipv4Addr) -> Result<Option<HeldEntry>, Error> {
        let k = BfdHoldKey::new(local, peer);
        match self.map.get(&k, 0) {
            Ok(v) => Ok(Some(HeldEntry::from_map(&k, &v))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(NAME)(e)),
        }
    }

    /// Deletes the entry of (local, peer); a missing one is no error.
    pub fn remove(&mut self, local: Ipv4Addr, peer: Ipv4Addr) -> Result<(), Error> {
        match self.map.remove(&BfdHoldKey::new(local, peer)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(NAME)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_session_round_trips_through_the_map_value() {
        let s = HeldSession {
            local: Ipv4Addr::new(10, 0, 0, 11),
            peer: Ipv4Addr::new(10, 0, 0, 1),
            my_disc: 0x1122_3344,
            your_disc: 7,
            min_tx: Duration::from_millis(100),
            min_rx: Duration::from_millis(300),
            detect_mult: 3,
            peer_min_tx: Duration::from_millis(200),
            peer_min_rx: Duration::from_millis(50),
            peer_mult: 5,
            src_port: 49200,
            deadline: Duration::from_secs(1234),
        };
        let (k, v) = (s.key(), s.value());
        // wire order: 100 ms = 100000 us = 0x000186a0
        let raw: [u8; 4] = wire(v.min_tx_us);
        assert_eq!(raw, [0x00, 0x01, 0x86, 0xa0]);
        assert_eq!(k.local.to_ne_bytes(), [10, 0, 0, 11]);
        let e = HeldEntry::from_map(&k, &v);
        assert_eq!(e.session, s);
        assert_eq!((e.answered, e.refused, e.last_answer), (0, 0, None));
        assert!(e.live(Duration::from_secs(1233)));
        assert!(!e.live(Duration::from_secs(1234)));
    }

    /// The bytes the kernel sees, not a re-encoding of the host value.
    fn wire(v: Be32) -> [u8; 4] {
        v.to_ne_bytes()
    }
}
