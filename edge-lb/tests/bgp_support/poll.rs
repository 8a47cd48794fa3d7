//! A thread that samples the ToR's kernel route while something happens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Polls the ToR's kernel route for `vip` in a thread until stopped; counts the
/// samples without `via`.
pub(crate) struct Poller {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(usize, usize, Vec<String>)>,
}

impl Poller {
    pub(crate) fn start(ns: String, vip: &'static str, via: String) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut samples, mut missing, mut seen) = (0, 0, Vec::new());
            while !s.load(Ordering::Relaxed) {
                let r =
                    super::run("ip", &["-n", &ns, "-4", "route", "show", vip]).unwrap_or_default();
                samples += 1;
                if !r.contains(&via) {
                    missing += 1;
                    seen.push(r);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (samples, missing, seen)
        });
        Poller { stop, handle }
    }

    pub(crate) fn finish(self) -> (usize, usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}
