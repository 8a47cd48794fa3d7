//! ringlb controller: allocates VIPs for `type: LoadBalancer` Services from
//! `IPPool`s, writes them to the Services' status, and keeps pool status.
//!
//! Pure decisions live in [`ipam`], [`status`] and [`cleanup`] (the finalizer's);
//! everything that talks to the API server is in [`reconcile`], [`pools`],
//! [`rebuild`], [`leader`] and [`events`]; [`app`] starts the tasks in order.

pub mod announce;
pub mod app;
pub mod backends;
pub mod cleanup;
pub mod edge_acks;
pub mod events;
pub mod ipam;
pub mod leader;
pub mod metrics;
pub mod pools;
pub mod rebuild;
pub mod reconcile;
pub mod routing_watch;
pub mod status;
