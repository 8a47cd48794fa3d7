//! Fault-injection knobs for tests. All are safe to use from any thread while the
//! simulator runs, and take effect on the next request (or at once for open watches).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::store::Store;

/// The knobs. Get them from `SimHandle::faults()`.
pub struct Faults {
    drop_gen: watch::Sender<u64>,
    expire_next: AtomicU32,
    fail_writes: AtomicU32,
    delay_ms: AtomicU64,
    dropped: AtomicU64,
    store: Arc<Store>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Store>) -> Self {
        Faults {
            drop_gen: watch::channel(0).0,
            expire_next: AtomicU32::new(0),
            fail_writes: AtomicU32::new(0),
            delay_ms: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            store,
        }
    }

    /// Ends every open watch stream now (clients see the stream end cleanly, as when
    /// an apiserver restarts or a load balancer drops idle connections).
    pub fn drop_watches(&self) {
        self.drop_gen.send_modify(|g| *g += 1);
    }

    /// The next `n` watch or list requests that name a resourceVersion (other than
    /// "" and "0") are answered as if that version were too old: a watch gets an
    /// `ERROR` event with a 410 Expired Status, a list gets HTTP 410.
    pub fn expire_next(&self, n: u32) {
        self.expire_next.store(n, Ordering::SeqCst);
    }

    /// Forgets the whole change history: every resourceVersion before now is too old
    /// for a watch (410), exactly as after etcd compaction.
    pub fn compact(&self) {
        self.store.compact();
    }

    /// Answers the next `n` writes (POST, PUT, PATCH, DELETE) with 500 InternalError
    /// without applying them.
    pub fn fail_next_writes(&self, n: u32) {
        self.fail_writes.store(n, Ordering::SeqCst);
    }

    /// Delays every response by `d` (zero turns it off). Watch events are not delayed.
    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// How many watch streams were ended by `drop_watches` so far.
    pub fn dropped_watches(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    pub(crate) fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))
    }

    /// Consumes one unit of a counter if it is positive.
    fn take(c: &AtomicU32) -> bool {
        c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            .is_ok()
    }

    pub(crate) fn take_expire(&self) -> bool {
        Self::take(&self.expire_next)
    }

    pub(crate) fn take_write_failure(&self) -> bool {
        Self::take(&self.fail_writes)
    }

    pub(crate) fn drop_signal(&self) -> watch::Receiver<u64> {
        self.drop_gen.subscribe()
    }

    pub(crate) fn note_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count_down() {
        let f = Faults::new(Arc::new(Store::new(10)));
        f.expire_next(2);
        assert!(f.take_expire() && f.take_expire() && !f.take_expire());
        f.fail_next_writes(1);
        assert!(f.take_write_failure() && !f.take_write_failure());
        f.set_delay(Duration::from_millis(7));
        assert_eq!(f.delay(), Duration::from_millis(7));
    }
}
