//! Next hops kept current. A thread listens to the kernel's route, neighbour and link
//! notifications (`nexthop::Subscription`) and wakes the agent's loop; the loop
//! coalesces the wake-ups for `DEBOUNCE` (100 ms; refreshes stay `MIN_GAP`, 500 ms,
//! apart) and re-resolves every backend's next hop, writing only the ones that
//! changed. The datapath is touched only from the loop.
//!
//! ```text
//!  nexthop-watch thread: netlink groups LINK, NEIGH, IPV4_ROUTE, IPV6_ROUTE
//!        │ changes (the MAC of a neighbour in use, a route, a link, lost events)
//!        │ ──> pending (bounded) + Notify          link change ──> LinkCache::clear
//!        ▼
//!  agent loop: sleep Watcher::delay ──> Datapath::refresh_next_hops ──> log + metrics
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{counter::Counter, family::Family};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use ringlb_datapath::Datapath;
use ringlb_nexthop::{Change, KernelResolver, Subscription, Watch};

/// How long the loop waits for more notifications before it refreshes.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Least time between two refreshes that notifications trigger: a refresh re-resolves
/// every backend (about 8 µs each), and route churn on a busy host must not keep the
/// loop busy with them.
const MIN_GAP: Duration = Duration::from_millis(500);
/// Changes kept for the refresh log line; more are counted, not kept.
const MAX_PENDING: usize = 16;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Trigger {
    trigger: &'static str,
}

/// `ringlb_nexthop_*` metrics.
#[derive(Clone)]
pub(super) struct Metrics {
    refreshes: Family<Trigger, Counter>,
    rewritten: Counter,
    notifications: Counter,
    errors: Counter,
}

impl Metrics {
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Metrics {
            refreshes: Family::default(),
            rewritten: Counter::default(),
            notifications: Counter::default(),
            errors: Counter::default(),
        };
        r.register(
            "nexthop_refreshes",
            "Next-hop refreshes, by what triggered them (start, netlink, resync)",
            m.refreshes.clone(),
        );
        r.register(
            "nexthop_backends_rewritten",
            "Backend entries rewritten because their next hop changed",
            m.rewritten.clone(),
        );
        r.register(
            "nexthop_notifications",
            "Kernel route/neighbour/link notifications that can move a next hop",
            m.notifications.clone(),
        );
        r.register(
            "nexthop_refresh_errors",
            "Next-hop refreshes that failed to read or write the backends map",
            m.errors.clone(),
        );
        m
    }
}

#[derive(Default)]
struct Pending {
    changes: Vec<Change>,
    more: usize,
}

/// The running subscription (if it could be opened) and what it has seen since the
/// last refresh.
pub(super) struct Watcher {
    pub notify: Arc<Notify>,
    pending: Arc<Mutex<Pending>>,
    last_refresh: Mutex<Option<Instant>>,
    _watch: Option<Watch>,
}

impl Watcher {
    /// Subscribes in the agent's own network namespace. Without a subscription the
    /// next hops are still refreshed on every resync.
    pub(super) fn start(resolver: &KernelResolver, metrics: &Metrics) -> Self {
        let notify = Arc::new(Notify::new());
        let pending = Arc::new(Mutex::new(Pending::default()));
        let watch = match Subscription::open(None, resolver.next_hops_in_use()) {
            Ok(sub) => {
                let (notify, pending, links, seen) = (
                    notify.clone(),
                    pending.clone(),
                    resolver.link_cache(),
                    metrics.notifications.clone(),
                );
                Some(sub.spawn(move |changes| {
                    if changes
                        .iter()
                        .any(|c| matches!(c, Change::Link { .. } | Change::Overflow))
                    {
                        links.clear();
                    }
                    seen.inc_by(changes.len() as u64);
                    {
                        let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
                        for c in changes {
                            if p.changes.len() < MAX_PENDING && !p.changes.contains(c) {
                                p.changes.push(c.clone());
                            } else {
                                p.more += 1;
                            }
                        }
                    }
                    notify.notify_one();
                }))
            }
            Err(e) => {
                tracing::warn!(error = %e, "no next-hop subscription: next hops refresh on resync only");
                None
            }
        };
        Watcher {
            notify,
            pending,
            last_refresh: Mutex::new(None),
            _watch: watch,
        }
    }

    /// How long to wait, once notified, before refreshing: `DEBOUNCE`, stretched so that
    /// refreshes are at least `MIN_GAP` apart.
    pub(super) fn delay(&self) -> Duration {
        let last = *self.last_refresh.lock().unwrap_or_else(|p| p.into_inner());
        delay_after(last, Instant::now())
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Re-resolves every backend's next hop (blocking netlink calls: run it with
/// `block_in_place`) and logs what changed.
pub(super) fn refresh(
    dp: &mut dyn Datapath,
    watcher: &Watcher,
    metrics: &Metrics,
    trigger: &'static str,
) {
    let seen = watcher.take();
    let t0 = Instant::now();
    *watcher
        .last_refresh
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(t0);
    metrics.refreshes.get_or_create(&Trigger { trigger }).inc();
    let changes = seen
        .changes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match dp.refresh_next_hops() {
        Ok(n) => {
            metrics.rewritten.inc_by(n as u64);
            let elapsed_ms = t0.elapsed().as_secs_f64() * 1e3;
            if n > 0 {
                tracing::info!(trigger, rewritten = n, %changes, more = seen.more, elapsed_ms, "next hops refreshed");
            } else {
                tracing::debug!(trigger, rewritten = 0, %changes, more = seen.more, elapsed_ms, "next hops refreshed");
            }
        }
        Err(e) => {
            metrics.errors.inc();
            tracing::warn!(trigger, error = %e, %changes, "refreshing next hops");
        }
    }
}

fn delay_after(last: Option<Instant>, now: Instant) -> Duration {
    let gap = last.map_or(Duration::ZERO, |l| {
        (l + MIN_GAP).saturating_duration_since(now)
    });
    gap.max(DEBOUNCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshes_are_debounced_and_spaced() {
        let now = Instant::now();
        assert_eq!(delay_after(None, now), DEBOUNCE);
        assert_eq!(delay_after(Some(now), now), MIN_GAP);
        assert_eq!(
            delay_after(Some(now - Duration::from_millis(300)), now),
            Duration::from_millis(200)
        );
        assert_eq!(
            delay_after(Some(now - Duration::from_secs(5)), now),
            DEBOUNCE
        );
    }
}
