//! Per-VIP health on the edge: what a global traffic manager probes, and what the
//! route of a VIP below its health threshold becomes.
//!
//! ```text
//!  sync: Serving (backends + each Service's policy) + the programmed DesiredState
//!     └─> Tracker::evaluate (one Hysteresis per VIP:port, pure)
//!            ├─> routes with their de-preference ──> Speaker::announce / withdraw
//!            ├─> transitions ──> log line, Event, ringlb_vip_health_transitions_total
//!            └─> facts ──> Board::publish ──> GET /health/vip/<ip>[/<port>] (assess)
//! ```
//!
//! - `policy`: the Service annotations (`ringlb.io/min-ready-backends`,
//!   `ringlb.io/unhealthy-bgp`, `ringlb.io/health-hold-down`).
//! - `hysteresis`: the hold-down state machine of one VIP:port.
//! - `assess`: the pure decisions: route verdicts, the health answer and its reason.
//! - `tracker`: the state machines of every VIP:port, stepped once per sync.
//! - `pages`: the HTTP answers on the ops endpoint.
//! - `metrics`: `ringlb_vip_health_state`, `ringlb_vip_health_transitions_total`.
//!
//! Cross-region failover: a VIP:port with a failover VIP is never withdrawn for its
//! health while programmed (see `assess::verdict`); with no ready local backend its
//! health answer is 503 `failing over to <ip>` and `Tracker::evaluate` reports the
//! start and the end of the failover once each. Failover aliases (other regions'
//! VIPs accepted here) are not tracked: never announced, no health page (404).
//!
//! The Events (`VIPUnhealthy`, `VIPHealthy`, `FailoverActive`, `FailoverEnded`) are
//! written by `agent::health_events`.

pub mod assess;
pub mod hysteresis;
pub mod metrics;
pub mod pages;
pub mod policy;
pub mod tracker;

pub use assess::{PortFacts, Report, State};
pub use metrics::HealthMetrics;
pub use pages::Board;
pub use policy::HealthPolicy;
pub use tracker::{Changed, FailoverChanged, Tracker};
