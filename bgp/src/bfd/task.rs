//! The I/O task of one BFD session: it owns the [`Session`] state machine, the
//! transmit socket and the two timers (periodic transmit, detection), and reports
//! every state change on a watch and to its client (the BGP peer task) through a
//! typed message.
//!
//! On a hitless restart a session can be handed over instead of ended
//! ([`BfdHandle::hold`], see `super::hold`), and a new process can start one from
//! such a hand-over ([`Resumed`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::BfdConfig;
use super::fsm::{Action, Event, Session, Transition};
use super::hold::HeldBfd;
use super::metrics::BfdMetrics;
use super::packet::{Control, Diag, State};
use super::socket::{Hub, tx_socket};
use crate::metrics::Labels;

/// What callers can see of a BFD session.
#[derive(Debug, Clone, PartialEq)]
pub struct BfdStatus {
    pub state: State,
    pub diag: Diag,
    pub local_disc: u32,
    pub remote_disc: u32,
    pub detection_time: Option<Duration>,
    pub transitions: u64,
}

/// What the session tells its client: the session failed (Up → Down, not a peer's
/// AdminDown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BfdDown {
    pub diag: Diag,
}

/// How a session ends.
enum StopHow {
    /// AdminDown for a Detection Time (RFC 5880 §6.8.16).
    AdminDown,
    /// Hand the session over: its state goes out on `snapshot` (`None`: not
    /// resumable, so AdminDown); then `verdict` true ends it silently (someone
    /// else answers for it now), false with AdminDown.
    Hold {
        snapshot: oneshot::Sender<Option<HeldBfd>>,
        verdict: oneshot::Receiver<bool>,
    },
}

/// A session taken over from an earlier process; `on_first_send` runs once its
/// first packet is out (the holder can stop answering then).
pub struct Resumed {
    pub held: HeldBfd,
    pub on_first_send: Box<dyn FnOnce() + Send>,
}

/// A running session; dropping it does not stop it, [`BfdHandle::stop`] does.
pub struct BfdHandle {
    pub status: watch::Receiver<BfdStatus>,
    stop: Option<oneshot::Sender<StopHow>>,
    task: JoinHandle<()>,
}

impl BfdHandle {
    /// Send AdminDown to the peer (so its clients do not see a failure) and end.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(StopHow::AdminDown);
        }
        self.join().await;
    }

    /// Hand the session over for a hitless restart: when it is Up (and no Poll
    /// runs), `hold` gets its state and says whether someone now answers for
    /// it; if so the session ends without a packet, and its state is returned.
    /// Otherwise (not Up, or `hold` said no) it ends with AdminDown, as `stop`.
    pub async fn hold(mut self, hold: impl FnOnce(&HeldBfd) -> bool) -> Option<HeldBfd> {
        let (snap_tx, snap_rx) = oneshot::channel();
        let (verdict_tx, verdict_rx) = oneshot::channel();
        let held = match self.stop.take() {
            Some(s) => {
                let how = StopHow::Hold {
                    snapshot: snap_tx,
                    verdict: verdict_rx,
                };
                let _ = s.send(how);
                snap_rx.await.ok().flatten()
            }
            None => None,
        };
        let ok = held.as_ref().is_some_and(hold);
        let _ = verdict_tx.send(ok);
        self.join().await;
        held.filter(|_| ok)
    }

    async fn join(&mut self) {
        if tokio::time::timeout(Duration::from_secs(2), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

impl Drop for BfdHandle {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

/// Start the session with `peer`; failures go to `client`. With `resumed`, the
/// session goes on from an earlier process's (Up, same discriminators and
/// source port) when the discriminator is still free here.
pub fn spawn(
    hub: Arc<Hub>,
    cfg: BfdConfig,
    peer: IpAddr,
    source: Option<IpAddr>,
    client: mpsc::Sender<BfdDown>,
    metrics: BfdMetrics,
    resumed: Option<Resumed>,
) -> std::io::Result<BfdHandle> {
    let port = resumed.as_ref().map(|r| r.held.local.port());
    let sock = match tx_socket(source, SocketAddr::new(peer, cfg.port), &hub, port) {
        Ok(sock) => sock,
        Err(e) => {
            // not resumed: the datapath must stop answering for it now, not at
            // the deadline, or the next session cannot hear the peer
            if let Some(r) = resumed {
                (r.on_first_send)();
            }
            return Err(e);
        }
    };
    let want = resumed.as_ref().map(|r| r.held.resume.local_disc);
    let (disc, rx) = hub.register_with(peer, want);
    let (session, on_first_send) = match resumed {
        Some(r) if Some(disc) == want => {
            (Session::resume(cfg, r.held.resume), Some(r.on_first_send))
        }
        Some(r) => {
            tracing::info!(%peer, "held BFD discriminator taken here: starting afresh");
            (r.on_first_send)();
            (Session::new(cfg, disc), None)
        }
        None => (Session::new(cfg, disc), None),
    };
    let (st_tx, st_rx) = watch::channel(BfdStatus {
        state: session.state(),
        diag: Diag::None,
        local_disc: disc,
        remote_disc: session.remote_disc(),
        detection_time: session.detection_time(),
        transitions: 0,
    });
    let (stop_tx, stop_rx) = oneshot::channel();
    let name = peer.to_string();
    let t = SessionTask {
        label: vec![("peer".to_string(), name.clone())],
        name,
        peer,
        on_first_send,
        session,
        sock,
        rx,
        status: st_tx,
        client,
        metrics,
        tx_every: None,
        next_tx: None,
        detect_at: None,
        rng: u64::from(disc) | 1,
    };
    let span = tracing::info_span!("bfd", peer = %peer, disc);
    let task = tokio::spawn(
        async move {
            t.run(stop_rx).await;
            hub.unregister(disc);
        }
        .instrument(span),
    );
    Ok(BfdHandle {
        status: st_rx,
        stop: Some(stop_tx),
        task,
    })
}

struct SessionTask {
    name: String,
    peer: IpAddr,
    /// A resumed session: tell the holder once our own first packet is out.
    on_first_send: Option<Box<dyn FnOnce() + Send>>,
    label: Labels,
    session: Session,
    sock: UdpSocket,
    rx: mpsc::Receiver<Control>,
    status: watch::Sender<BfdStatus>,
    client: mpsc::Sender<BfdDown>,
    metrics: BfdMetrics,
    tx_every: Option<Duration>,
    next_tx: Option<Instant>,
    detect_at: Option<Instant>,
    rng: u64,
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl SessionTask {
    async fn run(mut self, mut stop: oneshot::Receiver<StopHow>) {
        self.metrics
            .session_state
            .get_or_create(&self.label)
            .set(self.session.state() as i64);
        if self.on_first_send.is_some() {
            tracing::info!(
                remote_disc = self.session.remote_disc(),
                "BFD session resumed Up from the earlier process's hold"
            );
        }
        self.carry_out();
        loop {
            tokio::select! {
                how = &mut stop => {
                    if let Ok(StopHow::Hold { snapshot, verdict }) = how
                        && self.hand_over(snapshot, verdict).await
                    {
                        return self.forget_metrics();
                    }
                    self.admin_down().await;
                    return self.forget_metrics();
                }
                Some(c) = self.rx.recv() => {
                    self.metrics.received.get_or_create(&self.label).inc();
                    self.session.event(Event::Rx(c));
                    self.carry_out();
                }
                _ = sleep_opt(self.detect_at) => {
                    self.detect_at = None;
                    self.session.event(Event::DetectTimerExpired);
                    self.carry_out();
                }
                _ = sleep_opt(self.next_tx) => {
                    let p = self.session.periodic();
                    self.send(&p);
                    self.schedule_tx();
                }
            }
        }
    }

    /// Offers the session's state; true when it was taken (end silently).
    async fn hand_over(
        &mut self,
        snapshot: oneshot::Sender<Option<HeldBfd>>,
        verdict: oneshot::Receiver<bool>,
    ) -> bool {
        let cfg = self.session.config();
        let held = match (self.session.resume_state(), self.sock.local_addr()) {
            (Some(resume), Ok(local)) => Some(HeldBfd {
                peer: self.peer,
                local,
                min_tx: cfg.min_tx,
                min_rx: cfg.min_rx,
                multiplier: cfg.multiplier,
                resume,
                hold_for: Duration::ZERO,
            }),
            _ => None,
        };
        let offered = held.is_some();
        if snapshot.send(held).is_err() || !offered {
            return false;
        }
        let taken = verdict.await.unwrap_or(false);
        if taken {
            tracing::info!(
                "BFD session handed over Up (no AdminDown): the datapath answers for it"
            );
        }
        taken
    }

    async fn admin_down(&mut self) {
        self.session.event(Event::AdminDown);
        self.carry_out();
        // RFC 5880 §6.8.16: AdminDown for a Detection Time, not once, so
        // one lost datagram does not read as a failure at the peer (which
        // would end the graceful restart this AdminDown announces).
        // Bounded well inside the 2 s `stop` allows.
        let gap = self.tx_every.unwrap_or(Duration::from_millis(100));
        let gap = gap.min(Duration::from_millis(500));
        for _ in 1..self.session.periodic().detect_mult.clamp(1, 3) {
            tokio::time::sleep(gap).await;
            let p = self.session.periodic();
            self.send(&p);
        }
    }

    fn forget_metrics(&self) {
        self.metrics.session_state.remove(&self.label);
        self.metrics.detection_time_ms.remove(&self.label);
    }

    fn carry_out(&mut self) {
        for a in self.session.take_actions() {
            match a {
                Action::Send(c) => self.send(&c),
                Action::TxInterval(d) => {
                    self.tx_every = d;
                    // A faster rate takes effect now, not after the old interval.
                    let sooner = match (d, self.next_tx) {
                        (Some(d), Some(at)) => Instant::now() + d < at,
                        (Some(_), None) => true,
                        (None, _) => false,
                    };
                    if sooner || d.is_none() {
                        self.schedule_tx();
                    }
                }
                Action::DetectTimer(d) => {
                    self.detect_at = d.map(|d| Instant::now() + d);
                    if d.is_some() && self.status.borrow().detection_time != d {
                        self.publish_detection(d);
                    }
                }
                Action::Changed(t) => self.changed(t),
            }
        }
    }

    /// RFC 5880 §6.8.7: 75-100% of the interval (75-90% with a multiplier of 1).
    fn schedule_tx(&mut self) {
        self.next_tx = self.tx_every.map(|d| {
            let mut x = self.rng;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.rng = x;
            let span = if self.session.periodic().detect_mult == 1 {
                150
            } else {
                250
            };
            Instant::now() + d.mul_f64(0.75 + (x % span) as f64 / 1000.0)
        });
    }

    fn send(&mut self, c: &Control) {
        match self.sock.try_send(&c.encode()) {
            Ok(_) => {
                self.metrics.sent.get_or_create(&self.label).inc();
                if let Some(f) = self.on_first_send.take() {
                    f();
                }
            }
            // An unreachable peer (ICMP errors on the connected socket, a full
            // buffer) is what the detection timer is for; no log on the fast path.
            Err(e) => tracing::trace!(error = %e, "BFD send failed"),
        }
    }

    /// The detection time changes with the peer's timers (e.g. when its poll after
    /// Up lowers its interval), not only on transitions.
    fn publish_detection(&mut self, d: Option<Duration>) {
        self.metrics
            .detection_time_ms
            .get_or_create(&self.label)
            .set(d.map(|d| d.as_millis() as i64).unwrap_or(0));
        self.status.send_modify(|s| s.detection_time = d);
    }

    fn changed(&mut self, t: Transition) {
        let detection = self.session.detection_time();
        tracing::info!(
            from = t.from.as_str(),
            to = t.to.as_str(),
            diag = t.diag.as_str(),
            detection_ms = detection.map(|d| d.as_millis() as u64),
            "BFD state change"
        );
        self.metrics
            .session_state
            .get_or_create(&self.label)
            .set(t.to as i64);
        self.metrics.transition(&self.name, t.to.as_str());
        self.publish_detection(detection);
        let remote = self.session.remote_disc();
        self.status.send_modify(|s| {
            s.state = t.to;
            s.diag = t.diag;
            s.remote_disc = remote;
            s.transitions += 1;
        });
        if t.from == State::Up && t.to == State::Down && t.failure {
            let _ = self.client.try_send(BfdDown { diag: t.diag });
        }
    }
}
