//! ringlb-edge: the edge agent. It watches the API (Services, EndpointSlices, the BGP
//! objects), turns what it sees into Maglev tables and the datapath's desired state
//! (pure: `serving`, `tables`, `peers::select`), programs the datapath (`ringlb-xdp`)
//! and tells the BGP speaker (`ringlb-bgp`) which VIPs to announce.
//!
//! - `serving`: Services + EndpointSlices -> the backends of every VIP:port (pure).
//! - `source_ranges`: a Service's `loadBalancerSourceRanges` (field or annotation) (pure).
//! - `affinity`: a Service's `sessionAffinity: ClientIP` and its timeout (pure).
//! - `tables`: those backends -> Maglev tables, datapath entries, VIPs to announce (pure).
//! - `peers`: `BGPPeer`/`BGPAdvertisement`/`IPPool` -> the speaker's peers; status.
//! - `agent`: the tasks of `ringlb-edge run` that wire it all together.
//! - `node`: `ringlb-edge node`, the worker-node agent that feeds `ringlb-node`.
//! - `watch`: the reflectors both agents read, and waiting for their first lists.
//! - `vip_health`: per-VIP health: the hold-down, the de-preferred routes, the
//!   `/health/vip/<ip>[/<port>]` pages a global traffic manager probes.

pub mod affinity;
pub mod agent;
pub mod bfd_hold;
pub mod node_agent;
pub mod peers;
pub mod serving;
pub mod source_ranges;
pub mod tables;
pub mod vip_health;
pub mod watch;

#[cfg(test)]
mod routes_tests;
