//! Prometheus metrics of the controller (prefix `ringlb_controller_`).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Every metric the controller exports.
#[derive(Clone)]
pub struct Metrics {
    /// Addresses drawn from pools, by family.
    pub allocations: Family<Labels, Counter>,
    /// Addresses taken over from Service statuses at start-up or first sight.
    pub adoptions: Counter,
    /// Addresses given back (Service deleted, no longer ours, request changed).
    pub releases: Counter,
    /// User-caused refusals, by reason (pool_exhausted, ip_in_use, ...).
    pub refusals: Family<Labels, Counter>,
    /// Warnings that do not stop allocation (ip_outside_pools, rebuild_conflict).
    pub warnings: Family<Labels, Counter>,
    /// Addresses held, per pool and family.
    pub pool_allocated: Family<Labels, Gauge>,
    /// Free addresses per pool and family (a float: IPv6 pools exceed 2^64).
    pub pool_free: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Duration of one Service reconcile.
    pub reconcile_duration: Histogram,
    /// Reconciles that failed with an API error (retried with backoff).
    pub reconcile_errors: Counter,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            allocations: Family::default(),
            adoptions: Counter::default(),
            releases: Counter::default(),
            refusals: Family::default(),
            warnings: Family::default(),
            pool_allocated: Family::default(),
            pool_free: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            reconcile_errors: Counter::default(),
            leader: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("controller");
        r.register(
            "allocations",
            "Addresses drawn from pools, by family",
            m.allocations.clone(),
        );
        r.register(
            "adoptions",
            "Addresses taken over from Service statuses",
            m.adoptions.clone(),
        );
        r.register("releases", "Addresses given back", m.releases.clone());
        r.register(
            "refusals",
            "User-caused allocation refusals, by reason",
            m.refusals.clone(),
        );
        r.register(
            "warnings",
            "Warnings that did not stop allocation, by reason",
            m.warnings.clone(),
        );
        r.register(
            "pool_allocated_addresses",
            "Addresses held, per pool and family",
            m.pool_allocated.clone(),
        );
        r.register(
            "pool_free_addresses",
            "Free addresses, per pool and family",
            m.pool_free.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Duration of one Service reconcile",
            m.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles failed with an API error",
            m.reconcile_errors.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        m
    }

    pub fn refused(&self, reason: &str) {
        self.refusals
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    pub fn warned(&self, reason: &str) {
        self.warnings
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    pub fn allocated(&self, family: &str) {
        self.allocations
            .get_or_create(&vec![("family".into(), family.into())])
            .inc();
    }

    pub fn set_pool_usage(&self, pool: &str, family: &str, allocated: u64, free: u128) {
        let l = vec![
            ("pool".into(), pool.into()),
            ("family".into(), family.into()),
        ];
        self.pool_allocated.get_or_create(&l).set(allocated as i64);
        self.pool_free.get_or_create(&l).set(free as f64);
    }
}
