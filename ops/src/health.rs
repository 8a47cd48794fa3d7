//! Liveness and readiness, as `/healthz` and `/readyz` report them.
//!
//! Readiness is a flag the program sets. Liveness is fed by the program's loops: each
//! long-running loop registers a [`Heartbeat`] with an allowance and beats while it
//! turns. When any heartbeat has been silent for longer than its allowance,
//! [`Health::is_live`] is false and `/healthz` answers 503 naming the stalled loop,
//! so the kubelet restarts a process whose loop died, ended, or hangs.
//!
//! What counts as a beat is the loop's business; the rule of thumb is "the loop is
//! waiting for input, or has just finished one round". [`Heartbeat::next`] does this
//! for a loop over a stream: it beats while the loop waits for the next item and when
//! the item arrives, but not while the loop handles it. An API outage does not silence
//! such a loop (the watch keeps failing and retrying, the loop keeps waiting); a loop
//! stuck inside one item, or one that stopped, is silent.
//!
//! ```no_run
//! # async fn f(health: std::sync::Arc<ringlb_ops::Health>, mut events: futures::stream::Empty<()>) {
//! use std::time::Duration;
//! let heartbeat = health.heartbeat("service-watch", Duration::from_secs(60));
//! while let Some(ev) = heartbeat.next(&mut events).await {
//!     // handle `ev`; a handler that hangs for 60 s makes /healthz fail
//! }
//! # }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

/// Liveness (heartbeats) and readiness (a flag, and no fault) of one program.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    beats: Mutex<Vec<Arc<Beat>>>,
    /// Named reasons the program is not ready however its flag stands (e.g. a
    /// datapath whose transmits fail); `/readyz` lists them.
    faults: Mutex<std::collections::BTreeMap<String, String>>,
}

/// One registered loop: its name, allowance and last beat.
#[derive(Debug)]
struct Beat {
    name: String,
    allowance: Duration,
    last: Mutex<Instant>,
}

/// A loop that has been silent for longer than its allowance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stalled {
    pub name: String,
    pub silent_for: Duration,
    pub allowance: Duration,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} silent for {:.1}s (allowed {:.1}s)",
            self.name,
            self.silent_for.as_secs_f64(),
            self.allowance.as_secs_f64()
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data (instants, a list): a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Health {
    /// Live (no heartbeats yet) and not ready.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The flag is set and no fault stands.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && lock(&self.faults).is_empty()
    }

    /// Sets (`Some(reason)`) or clears (`None`) the fault `name`: while any fault
    /// stands the program is not ready, and `/readyz` names it and its reason.
    pub fn set_fault(&self, name: &str, reason: Option<String>) {
        let mut f = lock(&self.faults);
        match reason {
            Some(r) => f.insert(name.to_string(), r),
            None => f.remove(name),
        };
    }

    /// The standing faults: (name, reason).
    pub fn faults(&self) -> Vec<(String, String)> {
        lock(&self.faults)
            .iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect()
    }

    /// Registers a loop named `name` that must beat at least every `allowance`; it
    /// counts as having just beaten. A registration lasts as long as the program:
    /// dropping the [`Heartbeat`] does not end it, so a loop that ends or panics
    /// turns `/healthz` to 503 once its allowance has passed.
    pub fn heartbeat(&self, name: impl Into<String>, allowance: Duration) -> Heartbeat {
        let beat = Arc::new(Beat {
            name: name.into(),
            allowance,
            last: Mutex::new(Instant::now()),
        });
        lock(&self.beats).push(beat.clone());
        Heartbeat { beat }
    }

    /// The loops silent for longer than their allowance, as of `now`.
    pub fn stalled_at(&self, now: Instant) -> Vec<Stalled> {
        lock(&self.beats)
            .iter()
            .filter_map(|b| {
                let silent_for = now.saturating_duration_since(*lock(&b.last));
                (silent_for > b.allowance).then(|| Stalled {
                    name: b.name.clone(),
                    silent_for,
                    allowance: b.allowance,
                })
            })
            .collect()
    }

    /// The loops silent for longer than their allowance.
    pub fn stalled(&self) -> Vec<Stalled> {
        self.stalled_at(Instant::now())
    }

    /// True while every registered loop beats within its allowance.
    pub fn is_live(&self) -> bool {
        self.stalled().is_empty()
    }
}

/// The handle a loop beats with; see [`Health::heartbeat`].
#[derive(Debug)]
pub struct Heartbeat {
    beat: Arc<Beat>,
}

impl Heartbeat {
    /// The loop is turning.
    pub fn beat(&self) {
        *lock(&self.beat.last) = Instant::now();
    }

    pub fn allowance(&self) -> Duration {
        self.beat.allowance
    }

    /// Waits for `stream`'s next item, beating every quarter allowance while it waits
    /// and once more when the item arrives. Time spent handling the item between two
    /// calls is not covered: that is what the allowance bounds.
    pub async fn next<S: Stream + Unpin>(&self, stream: &mut S) -> Option<S::Item> {
        let period = (self.beat.allowance / 4).max(Duration::from_millis(1));
        loop {
            self.beat();
            tokio::select! {
                item = stream.next() => {
                    self.beat();
                    return item;
                }
                () = tokio::time::sleep(period) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_loop_stalls_after_its_allowance() {
        let health = Health::new();
        assert!(health.is_live(), "no loops yet: live");
        let fast = health.heartbeat("fast", Duration::from_secs(10));
        let _slow = health.heartbeat("slow", Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(health.stalled_at(t0 + Duration::from_secs(5)), []);
        let stalled = health.stalled_at(t0 + Duration::from_secs(30));
        assert_eq!(
            stalled.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["fast"]
        );
        assert!(stalled[0].to_string().starts_with("fast silent for"));
        assert_eq!(health.stalled_at(t0 + Duration::from_secs(90)).len(), 2);
        // Dropping the handle does not unregister: a loop that ended is stalled too.
        drop(fast);
        assert_eq!(health.stalled_at(t0 + Duration::from_secs(30)).len(), 1);
    }

    #[test]
    fn a_beat_resets_the_silence() {
        let health = Health::new();
        let hb = health.heartbeat("loop", Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!health.is_live());
        hb.beat();
        assert!(health.is_live());
    }

    #[tokio::test]
    async fn waiting_for_input_beats_handling_it_does_not() {
        let health = Health::new();
        let hb = health.heartbeat("loop", Duration::from_millis(300));
        let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
        let mut rx = rx;
        // Waiting on an idle stream for several allowances: still live.
        let waited = tokio::time::timeout(Duration::from_millis(1000), hb.next(&mut rx)).await;
        assert!(waited.is_err(), "nothing was sent");
        assert!(health.is_live());
        tx.unbounded_send(7).unwrap();
        assert_eq!(hb.next(&mut rx).await, Some(7));
        assert!(health.is_live());
        // "Handling" the item for longer than the allowance: stalled.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(health.stalled()[0].name, "loop");
        drop(tx);
        assert_eq!(hb.next(&mut rx).await, None);
        assert!(health.is_live(), "the end of the stream is a beat");
    }
}
