//! The RFC 4271 §8 finite state machine of one BGP peer, as a pure synchronous function
//! of (state, event). No sockets, no clocks, no `.await`: the session task feeds it
//! typed events and carries out the [`Action`]s it queues (connect, send, start/stop a
//! timer, tell the speaker the session went up or down). Every transition is therefore
//! testable without I/O (see the tests at the bottom).
//!
//! Deviations, on purpose:
//! - Connection collision (§6.8) is decided by [`resolve_collision`]; the losing
//!   connection is dumped with Cease/Connection Collision Resolution and the FSM,
//!   which owns the session, carries on with the winner from Active (event 23 takes
//!   us to Active instead of Idle, because the winner is about to be handed in).
//! - DampPeerOscillations is always on: every fall back to Idle arms the IdleHold
//!   timer with exponential backoff (1 s, 2 s, 4 s ... capped), and its expiry is the
//!   AutomaticStart event. Reaching Established resets the backoff.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::codec::{Afi, Capability, Message, Notification, Open, notif};

/// RFC 4271 §8.2.2 states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "Idle",
            State::Connect => "Connect",
            State::Active => "Active",
            State::OpenSent => "OpenSent",
            State::OpenConfirm => "OpenConfirm",
            State::Established => "Established",
        }
    }
    /// Numeric value for the `session_state` gauge (BGP4-MIB bgpPeerState order).
    pub fn mib_value(self) -> i64 {
        match self {
            State::Idle => 1,
            State::Connect => 2,
            State::Active => 3,
            State::OpenSent => 4,
            State::OpenConfirm => 5,
            State::Established => 6,
        }
    }
}

/// The timers the session task runs for the FSM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    ConnectRetry,
    Hold,
    Keepalive,
    /// Backoff before an automatic restart (RFC 4271 §8.1.1 IdleHoldTimer).
    IdleHold,
}

/// RFC 4271 §8.1 events (the ones this speaker can see).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Event 1: ManualStart.
    ManualStart,
    /// Event 2: ManualStop (drain / shutdown / peer removed).
    ManualStop,
    /// Event 3: AutomaticStart (IdleHold timer expired after an error).
    AutomaticStart,
    /// Event 4: ManualStart_with_PassiveTcpEstablishment.
    ManualStartPassive,
    /// Event 9: ConnectRetryTimer_Expires.
    ConnectRetryTimerExpires,
    /// Event 10: HoldTimer_Expires.
    HoldTimerExpires,
    /// Event 11: KeepaliveTimer_Expires.
    KeepaliveTimerExpires,
    /// Event 13: IdleHoldTimer_Expires.
    IdleHoldTimerExpires,
    /// Event 16: Tcp_CR_Acked (our outbound connection is up).
    TcpCrAcked,
    /// Event 17: TcpConnectionConfirmed (the peer's inbound connection, accepted).
    TcpConnectionConfirmed,
    /// Event 18: TcpConnectionFails.
    TcpConnectionFails,
    /// Event 19: BGPOpen.
    BgpOpen(Box<Open>),
    /// Event 21: BGPHeaderErr; 22: BGPOpenMsgErr. Carries the NOTIFICATION to send.
    BgpMessageErr(Notification),
    /// Event 23: OpenCollisionDump.
    OpenCollisionDump,
    /// Event 25: NotifMsg.
    NotifMsg(Notification),
    /// Event 26: KeepAliveMsg.
    KeepAliveMsg,
    /// Event 27: UpdateMsg (also ROUTE-REFRESH, which restarts the hold timer too).
    UpdateMsg,
    /// Event 28: UpdateMsgErr. Carries the NOTIFICATION to send.
    UpdateMsgErr(Notification),
}

/// What the session task must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open the outbound TCP connection (cancel any previous attempt).
    Connect,
    /// Close the TCP connection (after flushing what was queued).
    Disconnect,
    Send(Message),
    StartTimer(Timer, Duration),
    StopTimer(Timer),
    /// The session reached Established: send the whole Adj-RIB-Out.
    SessionUp(Negotiated),
    /// The session left Established: forget what was sent; count a flap.
    SessionDown(String),
    /// Record the last error (for metrics and status). `kind` is the metric label.
    Error {
        kind: &'static str,
        message: String,
    },
}

/// Parameters agreed in the OPEN exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub hold_time: Duration,
    pub keepalive: Duration,
    pub four_octet_asn: bool,
    pub families: Vec<Afi>,
    pub route_refresh: bool,
    pub peer_bgp_id: Ipv4Addr,
    /// The peer's OPEN carried the graceful restart capability (RFC 4724 §3): it
    /// can keep our routes while we restart.
    pub peer_graceful_restart: bool,
}

/// Static FSM configuration of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsmConfig {
    pub local_asn: u32,
    pub peer_asn: u32,
    pub bgp_id: Ipv4Addr,
    /// Proposed hold time (0 or >= 3 s).
    pub hold_time: u16,
    /// Configured keepalive; 0 means hold_time / 3.
    pub keepalive: u16,
    pub connect_retry: Duration,
    pub passive: bool,
    pub families: Vec<Afi>,
    /// Cap of the restart backoff.
    pub max_backoff: Duration,
    /// Capabilities added to our OPEN (graceful restart, see `gr.rs`).
    pub extra_capabilities: Vec<Capability>,
}

/// Hold time used in OpenSent before the peer's OPEN arrives (RFC 4271 §8.2.2: "large").
pub const OPEN_SENT_HOLD: Duration = Duration::from_secs(240);

pub struct Fsm {
    pub cfg: FsmConfig,
    state: State,
    /// ConnectRetryCounter: falls back to Idle since the last Established.
    pub connect_retry_counter: u32,
    negotiated: Option<Negotiated>,
    /// After ManualStop we stay Idle until the next ManualStart.
    stopped: bool,
    actions: Vec<Action>,
}

/// Which connection survives a collision (RFC 4271 §6.8): the one opened by the side
/// with the higher BGP Identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollisionWinner {
    /// Keep the connection we initiated.
    Outbound,
    /// Keep the connection the peer initiated.
    Inbound,
}

pub fn resolve_collision(local_id: Ipv4Addr, remote_id: Ipv4Addr) -> CollisionWinner {
    if u32::from(local_id) > u32::from(remote_id) {
        CollisionWinner::Outbound
    } else {
        CollisionWinner::Inbound
    }
}

impl Fsm {
    pub fn new(cfg: FsmConfig) -> Fsm {
        Fsm {
            cfg,
            state: State::Idle,
            connect_retry_counter: 0,
            negotiated: None,
            stopped: true,
            actions: Vec::new(),
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Take the actions queued by the last events, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Backoff before the next automatic start: 1 s doubling per failure, capped.
    pub fn backoff(&self) -> Duration {
        let exp = self.connect_retry_counter.saturating_sub(1).min(16);
        Duration::from_secs(1u64 << exp).min(self.cfg.max_backoff)
    }

    fn open(&self) -> Open {
        let mut o = Open::new(
            self.cfg.local_asn,
            self.cfg.hold_time,
            self.cfg.bgp_id,
            &self.cfg.families,
        );
        o.capabilities
            .extend(self.cfg.extra_capabilities.iter().cloned());
        o
    }

    fn push(&mut self, a: Action) {
        self.actions.push(a);
    }

    fn send_notification(&mut self, n: Notification) {
        self.push(Action::Error {
            kind: "notification_sent",
            message: format!("sent NOTIFICATION {n}"),
        });
        self.push(Action::Send(Message::Notification(n)));
    }

    /// Apply one event. Returns the new state when it changed.
    pub fn fsm_event(&mut self, ev: Event) -> Option<State> {
        use State::*;
        let next = match (self.state, ev) {
            // ---- Idle: starting, or stopping the restart backoff
            (Idle, ev) => self.idle_event(ev),

            // ---- ManualStop in any other state
            (s, Event::ManualStop) => {
                if matches!(s, OpenSent | OpenConfirm | Established) {
                    self.send_notification(Notification::new(notif::CEASE, notif::ADMIN_SHUTDOWN));
                }
                self.stopped = true;
                self.connect_retry_counter = 0;
                Some(Idle)
            }

            // ---- errors and NOTIFICATIONs, in any other state
            (_, Event::BgpMessageErr(n) | Event::UpdateMsgErr(n)) => {
                self.send_notification(n);
                Some(self.fail())
            }
            (_, Event::NotifMsg(n)) => {
                self.push(Action::Error {
                    kind: "notification_received",
                    message: format!("received NOTIFICATION {n}"),
                });
                Some(self.fail())
            }

            (s @ (Connect | Active), ev) => self.connecting_event(s, ev),
            (s @ (OpenSent | OpenConfirm | Established), ev) => self.session_event(s, ev),
        };
        match next {
            Some(n) if n != self.state => {
                self.fsm_state_change(n);
                Some(n)
            }
            _ => None,
        }
    }

    /// An event in Idle.
    fn idle_event(&mut self, ev: Event) -> Option<State> {
        match ev {
            // ---- starting
            Event::ManualStart | Event::ManualStartPassive => {
                self.stopped = false;
                self.connect_retry_counter = 0;
                Some(self.start())
            }
            Event::AutomaticStart | Event::IdleHoldTimerExpires if !self.stopped => {
                Some(self.start())
            }
            Event::ManualStop => {
                // Stop during the restart backoff: no automatic restart any more.
                self.stopped = true;
                self.connect_retry_counter = 0;
                self.push(Action::StopTimer(Timer::IdleHold));
                None
            }
            _ => None, // Idle refuses everything else (incoming connections too)
        }
    }

    /// An event in Connect or Active (other than ManualStop and errors).
    fn connecting_event(&mut self, s: State, ev: Event) -> Option<State> {
        use State::*;
        match (s, ev) {
            // ---- Connect: our TCP connect is in flight
            (Connect, Event::ConnectRetryTimerExpires) => {
                self.push(Action::Disconnect);
                self.push(Action::StartTimer(
                    Timer::ConnectRetry,
                    self.cfg.connect_retry,
                ));
                self.push(Action::Connect);
                None
            }
            (Connect | Active, Event::TcpCrAcked | Event::TcpConnectionConfirmed) => {
                self.push(Action::StopTimer(Timer::ConnectRetry));
                self.push(Action::Send(Message::Open(self.open())));
                self.push(Action::StartTimer(Timer::Hold, OPEN_SENT_HOLD));
                Some(OpenSent)
            }
            (Connect, Event::TcpConnectionFails) => {
                self.push(Action::StartTimer(
                    Timer::ConnectRetry,
                    self.cfg.connect_retry,
                ));
                Some(Active)
            }
            // ---- Active: waiting for the peer (or for ConnectRetry to try again)
            (Active, Event::ConnectRetryTimerExpires) => {
                if self.cfg.passive {
                    self.push(Action::StartTimer(
                        Timer::ConnectRetry,
                        self.cfg.connect_retry,
                    ));
                    None
                } else {
                    self.push(Action::StartTimer(
                        Timer::ConnectRetry,
                        self.cfg.connect_retry,
                    ));
                    self.push(Action::Connect);
                    Some(Connect)
                }
            }
            (Active, Event::TcpConnectionFails) => None,
            _ => None,
        }
    }

    /// An event in OpenSent, OpenConfirm or Established (other than ManualStop and
    /// errors).
    fn session_event(&mut self, s: State, ev: Event) -> Option<State> {
        use State::*;
        match (s, ev) {
            // ---- OpenSent
            (OpenSent, Event::BgpOpen(open)) => self.on_open(&open),
            (OpenSent, Event::TcpConnectionFails) => {
                self.push(Action::Disconnect);
                self.push(Action::StopTimer(Timer::Hold));
                self.push(Action::StartTimer(
                    Timer::ConnectRetry,
                    self.cfg.connect_retry,
                ));
                Some(Active)
            }
            (OpenSent | OpenConfirm, Event::OpenCollisionDump) => {
                self.send_notification(Notification::new(
                    notif::CEASE,
                    notif::CONNECTION_COLLISION,
                ));
                self.push(Action::Disconnect);
                self.push(Action::StopTimer(Timer::Hold));
                self.push(Action::StopTimer(Timer::Keepalive));
                self.negotiated = None;
                Some(Active)
            }

            // ---- OpenConfirm
            (OpenConfirm, Event::KeepAliveMsg) => {
                let n = self.negotiated.clone();
                if let Some(n) = n {
                    self.restart_hold(&n);
                    self.connect_retry_counter = 0;
                    self.push(Action::SessionUp(n));
                }
                Some(Established)
            }

            // ---- keepalive / hold timers in OpenConfirm and Established
            (OpenConfirm | Established, Event::KeepaliveTimerExpires) => {
                self.push(Action::Send(Message::Keepalive));
                if let Some(n) = &self.negotiated {
                    let k = n.keepalive;
                    self.push(Action::StartTimer(Timer::Keepalive, k));
                }
                None
            }
            (Established, Event::KeepAliveMsg | Event::UpdateMsg) => {
                if let Some(n) = self.negotiated.clone() {
                    self.restart_hold(&n);
                }
                None
            }
            (OpenSent | OpenConfirm | Established, Event::HoldTimerExpires) => {
                self.send_notification(Notification::new(notif::HOLD_TIMER_EXPIRED, 0));
                Some(self.fail())
            }
            (OpenConfirm | Established, Event::TcpConnectionFails) => {
                self.push(Action::Error {
                    kind: "connection_lost",
                    message: "TCP connection closed".into(),
                });
                Some(self.fail())
            }
            // Anything else that arrives in a state where it makes no sense is an FSM
            // error (RFC 6608 subcodes 1..3 by state).
            (s, e) => {
                let sub = match s {
                    OpenSent => 1,
                    OpenConfirm => 2,
                    _ => 3,
                };
                if matches!(
                    e,
                    Event::BgpOpen(_) | Event::KeepAliveMsg | Event::UpdateMsg
                ) {
                    self.send_notification(Notification::new(notif::FSM, sub));
                    Some(self.fail())
                } else {
                    None // timers of other states firing late: ignore
                }
            }
        }
    }

    /// Idle -> Connect (active) or Active (passive).
    fn start(&mut self) -> State {
        self.push(Action::StopTimer(Timer::IdleHold));
        self.push(Action::StartTimer(
            Timer::ConnectRetry,
            self.cfg.connect_retry,
        ));
        if self.cfg.passive {
            State::Active
        } else {
            self.push(Action::Connect);
            State::Connect
        }
    }

    /// An error: count it; the transition to Idle arms the restart backoff.
    fn fail(&mut self) -> State {
        self.connect_retry_counter = self.connect_retry_counter.saturating_add(1);
        State::Idle
    }

    fn restart_hold(&mut self, n: &Negotiated) {
        if !n.hold_time.is_zero() {
            self.push(Action::StartTimer(Timer::Hold, n.hold_time));
        }
    }

    /// OpenSent + BGPOpen: check the OPEN (RFC 4271 §6.2), agree the timers.
    fn on_open(&mut self, open: &Open) -> Option<State> {
        let err = |sub| Notification::new(notif::OPEN, sub);
        if open.asn() != self.cfg.peer_asn {
            let mut n = err(notif::BAD_PEER_AS);
            n.data = open.my_as.to_be_bytes().to_vec();
            self.send_notification(n);
            return Some(self.fail());
        }
        let ibgp = self.cfg.peer_asn == self.cfg.local_asn;
        if ibgp && open.bgp_id == self.cfg.bgp_id {
            self.send_notification(err(notif::BAD_BGP_ID));
            return Some(self.fail());
        }
        let hold = open.hold_time.min(self.cfg.hold_time);
        let keepalive = if hold == 0 {
            0
        } else if self.cfg.keepalive > 0 {
            self.cfg.keepalive.min(hold / 3).max(1)
        } else {
            (hold / 3).max(1)
        };
        let theirs = open.families();
        let families = self
            .cfg
            .families
            .iter()
            .copied()
            .filter(|f| theirs.contains(f))
            .collect();
        let n = Negotiated {
            hold_time: Duration::from_secs(u64::from(hold)),
            keepalive: Duration::from_secs(u64::from(keepalive)),
            four_octet_asn: open.four_octet_asn(),
            families,
            route_refresh: open.route_refresh(),
            peer_bgp_id: open.bgp_id,
            peer_graceful_restart: super::gr::GrCapability::from_open(open).is_some(),
        };
        self.push(Action::Send(Message::Keepalive));
        if hold > 0 {
            self.push(Action::StartTimer(Timer::Keepalive, n.keepalive));
            self.push(Action::StartTimer(Timer::Hold, n.hold_time));
        } else {
            self.push(Action::StopTimer(Timer::Hold));
        }
        self.negotiated = Some(n);
        Some(State::OpenConfirm)
    }

    /// All side effects of entering `new`.
    fn fsm_state_change(&mut self, new: State) {
        let old = self.state;
        self.state = new;
        if new == State::Idle {
            self.push(Action::Disconnect);
            for t in [Timer::ConnectRetry, Timer::Hold, Timer::Keepalive] {
                self.push(Action::StopTimer(t));
            }
            if old == State::Established {
                self.push(Action::SessionDown("left Established".to_string()));
            }
            self.negotiated = None;
            if !self.stopped {
                let b = self.backoff();
                self.push(Action::StartTimer(Timer::IdleHold, b));
            }
        }
    }
}

#[cfg(test)]
mod tests;
