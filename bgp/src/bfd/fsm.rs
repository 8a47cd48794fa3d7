//! The BFD session state machine (RFC 5880 §6.2, §6.8), pure: the I/O task feeds it
//! [`Event`]s and carries out the [`Action`]s it queues. No clock, no socket: the
//! task owns the timers and only tells the machine when one ran out.
//!
//! Simplifications, on purpose:
//! - Asynchronous mode only; the peer's Demand bit is recorded and ignored.
//! - A lower transmit interval is applied at once; a higher one (the 1 s floor while
//!   not Up) too, with a Poll Sequence started as §6.8.3 asks. The peer's detection
//!   time only grows with ours when the session is going down anyway.

use std::time::Duration;

use super::BfdConfig;
use super::packet::{Control, Diag, State};

/// While the session is not Up we send at most once a second (RFC 5880 §6.8.3).
pub const SLOW_TX: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A packet for this session, already checked by [`super::packet::decode`].
    Rx(Control),
    /// No valid packet for a Detection Time.
    DetectTimerExpired,
    /// We stop the session (peer removed, shutdown): tell the peer AdminDown.
    AdminDown,
}

/// A state change, for the owner to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub diag: Diag,
    /// Whether clients (BGP) must treat this as a failure. A peer that says
    /// AdminDown is shutting BFD off, not failing (RFC 5882 §3.2).
    pub failure: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this packet now, outside the periodic schedule.
    Send(Control),
    /// The periodic transmit interval (before jitter); `None`: stop sending.
    TxInterval(Option<Duration>),
    /// Restart the detection timer with this duration from now; `None`: stop it.
    DetectTimer(Option<Duration>),
    Changed(Transition),
}

/// What an Up session is made of beyond its configuration: enough for another
/// process to go on with it (a session held by the datapath across a hitless
/// restart, `super::hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    pub local_disc: u32,
    pub remote_disc: u32,
    /// The peer's Desired Min TX, Required Min RX and Detect Mult, as last heard.
    pub remote_min_tx: Duration,
    pub remote_min_rx: Duration,
    pub remote_mult: u8,
}

pub struct Session {
    cfg: BfdConfig,
    local_disc: u32,
    remote_disc: u32,
    state: State,
    remote_state: State,
    diag: Diag,
    desired_min_tx: Duration,
    remote_min_rx: Duration,
    remote_min_tx: Duration,
    remote_mult: u8,
    polling: bool,
    tx_interval: Option<Duration>,
    actions: Vec<Action>,
}

impl Session {
    pub fn new(cfg: BfdConfig, local_disc: u32) -> Session {
        let mut s = Session {
            cfg,
            local_disc,
            remote_disc: 0,
            state: State::Down,
            remote_state: State::Down,
            diag: Diag::None,
            desired_min_tx: cfg.min_tx.max(SLOW_TX),
            // §6.8.1: initialised to 1 microsecond.
            remote_min_rx: Duration::from_micros(1),
            remote_min_tx: Duration::ZERO,
            remote_mult: 0,
            polling: false,
            tx_interval: None,
            actions: Vec::new(),
        };
        s.update_tx();
        s
    }

    /// A session that is Up already, taken over from an earlier process (which
    /// the peer never saw go): same discriminators, the peer's last timers, the
    /// Up transmit interval. Its first packet is queued at once (`Send`), the
    /// transmit interval and the detection timer are set; no transition is
    /// reported (nothing changed for the peer).
    pub fn resume(cfg: BfdConfig, r: Resume) -> Session {
        let mut s = Session {
            cfg,
            local_disc: r.local_disc,
            remote_disc: r.remote_disc,
            state: State::Up,
            remote_state: State::Up,
            diag: Diag::None,
            desired_min_tx: cfg.min_tx,
            remote_min_rx: r.remote_min_rx,
            remote_min_tx: r.remote_min_tx,
            remote_mult: r.remote_mult,
            polling: false,
            tx_interval: None,
            actions: Vec::new(),
        };
        s.update_tx();
        s.actions.push(Action::DetectTimer(s.detection_time()));
        s.actions.push(Action::Send(s.control(false, false)));
        s
    }

    /// What another process needs to resume this session: `None` unless it is Up
    /// and no Poll Sequence is running (a parameter change in flight).
    pub fn resume_state(&self) -> Option<Resume> {
        (self.state == State::Up && self.remote_state == State::Up && !self.polling).then_some(
            Resume {
                local_disc: self.local_disc,
                remote_disc: self.remote_disc,
                remote_min_tx: self.remote_min_tx,
                remote_min_rx: self.remote_min_rx,
                remote_mult: self.remote_mult,
            },
        )
    }

    /// The configuration the session runs with.
    pub fn config(&self) -> BfdConfig {
        self.cfg
    }

    pub fn state(&self) -> State {
        self.state
    }
    pub fn diag(&self) -> Diag {
        self.diag
    }
    pub fn local_disc(&self) -> u32 {
        self.local_disc
    }
    pub fn remote_disc(&self) -> u32 {
        self.remote_disc
    }

    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Detection time: the peer's multiplier times the slower of what we accept and
    /// what the peer sends at (§6.8.4). `None` until the peer has been heard.
    pub fn detection_time(&self) -> Option<Duration> {
        (self.remote_mult > 0)
            .then(|| self.cfg.min_rx.max(self.remote_min_tx) * u32::from(self.remote_mult))
    }

    /// The packet sent on the periodic schedule (Poll bit while a poll runs).
    pub fn periodic(&self) -> Control {
        self.control(self.polling, false)
    }

    fn control(&self, poll: bool, fin: bool) -> Control {
        Control {
            diag: self.diag,
            state: self.state,
            poll,
            fin,
            cpi: false,
            demand: false,
            detect_mult: self.cfg.multiplier,
            my_disc: self.local_disc,
            your_disc: self.remote_disc,
            desired_min_tx: self.desired_min_tx,
            required_min_rx: self.cfg.min_rx,
            required_min_echo_rx: Duration::ZERO,
        }
    }

    /// Apply one event; returns the transition when the state changed.
    pub fn event(&mut self, ev: Event) -> Option<Transition> {
        let before = self.state;
        match ev {
            Event::Rx(c) => self.rx(&c),
            Event::DetectTimerExpired => {
                self.remote_disc = 0;
                if matches!(self.state, State::Init | State::Up) {
                    self.set_state(State::Down, Diag::DetectionTimeExpired);
                }
                self.actions.push(Action::DetectTimer(None));
            }
            Event::AdminDown => {
                self.set_state(State::AdminDown, Diag::AdminDown);
                self.actions.push(Action::DetectTimer(None));
            }
        }
        let t = (self.state != before).then(|| Transition {
            from: before,
            to: self.state,
            diag: self.diag,
            failure: self.remote_state != State::AdminDown && self.state != State::AdminDown,
        });
        if let Some(t) = t {
            self.actions.push(Action::Changed(t));
            self.actions
                .push(Action::Send(self.control(self.polling, false)));
        }
        t
    }

    /// §6.8.6, after the checks the codec made and the demultiplexing.
    fn rx(&mut self, c: &Control) {
        self.remote_disc = c.my_disc;
        self.remote_state = c.state;
        self.remote_min_rx = c.required_min_rx;
        self.remote_min_tx = c.desired_min_tx;
        self.remote_mult = c.detect_mult;
        if c.fin && self.polling {
            self.polling = false;
        }
        self.update_tx();
        self.actions
            .push(Action::DetectTimer(self.detection_time()));
        if self.state == State::AdminDown {
            return;
        }
        match (self.state, c.state) {
            (State::Init | State::Up, State::AdminDown) => {
                self.set_state(State::Down, Diag::NeighborDown)
            }
            (_, State::AdminDown) => {}
            (State::Down, State::Down) => self.set_state(State::Init, Diag::None),
            (State::Down, State::Init) => self.set_state(State::Up, Diag::None),
            (State::Init, State::Init | State::Up) => self.set_state(State::Up, Diag::None),
            (State::Up, State::Down) => self.set_state(State::Down, Diag::NeighborDown),
            _ => {}
        }
        if c.poll {
            // §6.8.6: answer a Poll with Final as soon as practicable.
            self.actions.push(Action::Send(self.control(false, true)));
        }
    }

    fn set_state(&mut self, to: State, diag: Diag) {
        if to == self.state {
            return;
        }
        self.state = to;
        self.diag = diag;
        let desired = if to == State::Up {
            self.cfg.min_tx
        } else {
            self.cfg.min_tx.max(SLOW_TX)
        };
        if desired != self.desired_min_tx {
            self.desired_min_tx = desired;
            self.polling = true;
        }
        self.update_tx();
    }

    fn update_tx(&mut self) {
        let want = (!self.remote_min_rx.is_zero() && self.state != State::AdminDown)
            .then(|| self.desired_min_tx.max(self.remote_min_rx));
        if want != self.tx_interval {
            self.tx_interval = want;
            self.actions.push(Action::TxInterval(want));
        }
    }
}

#[cfg(test)]
#[path = "fsm_tests.rs"]
mod tests;
