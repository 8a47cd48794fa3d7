//! FSM transitions, no sockets.

use super::*;
use crate::codec::{Capability, Message};

fn cfg(passive: bool) -> FsmConfig {
    FsmConfig {
        local_asn: 65011,
        peer_asn: 65000,
        bgp_id: Ipv4Addr::new(10, 0, 0, 11),
        hold_time: 9,
        keepalive: 0,
        connect_retry: Duration::from_secs(5),
        passive,
        families: vec![Afi::Ipv4, Afi::Ipv6],
        max_backoff: Duration::from_secs(60),
        extra_capabilities: Vec::new(),
    }
}

fn peer_open(asn: u32, hold: u16) -> Box<Open> {
    Box::new(Open::new(
        asn,
        hold,
        Ipv4Addr::new(10, 0, 0, 1),
        &[Afi::Ipv4],
    ))
}

fn sent(actions: &[Action]) -> Vec<Message> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// Drive a fresh active FSM to Established.
/// Started and connected (OpenSent), its actions so far taken.
fn open_sent() -> Fsm {
    open_sent_with(cfg(false))
}

/// [`open_sent`] with the configuration `c`.
fn open_sent_with(c: FsmConfig) -> Fsm {
    let mut f = Fsm::new(c);
    f.fsm_event(Event::ManualStart);
    f.fsm_event(Event::TcpCrAcked);
    f.take_actions();
    f
}

/// The NOTIFICATION, (code, subcode), that `actions` send as their one message.
#[track_caller]
fn notification_sent(actions: &[Action]) -> (u8, u8) {
    match sent(actions).as_slice() {
        [Message::Notification(n)] => (n.code, n.subcode),
        other => panic!("{other:?}"),
    }
}

fn established() -> Fsm {
    let mut f = Fsm::new(cfg(false));
    f.fsm_event(Event::ManualStart);
    f.fsm_event(Event::TcpCrAcked);
    f.fsm_event(Event::BgpOpen(peer_open(65000, 3)));
    assert_eq!(f.fsm_event(Event::KeepAliveMsg), Some(State::Established));
    f.take_actions();
    f
}

#[test]
fn active_open_reaches_established_with_negotiated_timers() {
    let mut f = Fsm::new(cfg(false));
    assert_eq!(f.fsm_event(Event::ManualStart), Some(State::Connect));
    let a = f.take_actions();
    assert!(a.contains(&Action::Connect));
    assert!(a.contains(&Action::StartTimer(
        Timer::ConnectRetry,
        Duration::from_secs(5)
    )));

    assert_eq!(f.fsm_event(Event::TcpCrAcked), Some(State::OpenSent));
    let a = f.take_actions();
    match sent(&a).as_slice() {
        [Message::Open(o)] => {
            assert_eq!(o.asn(), 65011);
            assert_eq!(o.hold_time, 9);
            assert!(o.capabilities.contains(&Capability::RouteRefresh));
        }
        other => panic!("expected one OPEN, got {other:?}"),
    }
    assert!(a.contains(&Action::StartTimer(Timer::Hold, OPEN_SENT_HOLD)));

    // Peer proposes 3 s: negotiated hold 3, keepalive 1.
    assert_eq!(
        f.fsm_event(Event::BgpOpen(peer_open(65000, 3))),
        Some(State::OpenConfirm)
    );
    let a = f.take_actions();
    assert_eq!(sent(&a), vec![Message::Keepalive]);
    assert!(a.contains(&Action::StartTimer(Timer::Hold, Duration::from_secs(3))));
    assert!(a.contains(&Action::StartTimer(
        Timer::Keepalive,
        Duration::from_secs(1)
    )));
    let n = f.negotiated().unwrap();
    assert_eq!(n.families, vec![Afi::Ipv4], "peer only speaks IPv4");
    assert!(n.four_octet_asn);

    assert_eq!(f.fsm_event(Event::KeepAliveMsg), Some(State::Established));
    let a = f.take_actions();
    assert!(matches!(a.last(), Some(Action::SessionUp(_))));
}

#[test]
fn passive_open_waits_for_the_peer() {
    let mut f = Fsm::new(cfg(true));
    assert_eq!(f.fsm_event(Event::ManualStartPassive), Some(State::Active));
    assert!(!f.take_actions().contains(&Action::Connect));
    // ConnectRetry in passive mode does not dial out.
    assert_eq!(f.fsm_event(Event::ConnectRetryTimerExpires), None);
    assert!(!f.take_actions().contains(&Action::Connect));
    assert_eq!(
        f.fsm_event(Event::TcpConnectionConfirmed),
        Some(State::OpenSent)
    );
}

#[test]
fn connect_failure_goes_active_then_retries() {
    let mut f = Fsm::new(cfg(false));
    f.fsm_event(Event::ManualStart);
    assert_eq!(f.fsm_event(Event::TcpConnectionFails), Some(State::Active));
    f.take_actions();
    assert_eq!(
        f.fsm_event(Event::ConnectRetryTimerExpires),
        Some(State::Connect)
    );
    assert!(f.take_actions().contains(&Action::Connect));
}

#[test]
fn wrong_peer_as_sends_bad_peer_as_and_backs_off() {
    let mut f = open_sent();
    assert_eq!(
        f.fsm_event(Event::BgpOpen(peer_open(64999, 3))),
        Some(State::Idle)
    );
    let a = f.take_actions();
    assert_eq!(notification_sent(&a), (2, 2));
    assert!(a.contains(&Action::Disconnect));
    assert!(a.contains(&Action::StartTimer(Timer::IdleHold, Duration::from_secs(1))));
    // Restart after the backoff, fail again: backoff doubles.
    assert_eq!(
        f.fsm_event(Event::IdleHoldTimerExpires),
        Some(State::Connect)
    );
    f.fsm_event(Event::TcpCrAcked);
    f.fsm_event(Event::BgpOpen(peer_open(64999, 3)));
    assert!(
        f.take_actions()
            .contains(&Action::StartTimer(Timer::IdleHold, Duration::from_secs(2)))
    );
}

#[test]
fn backoff_is_capped() {
    let mut f = Fsm::new(cfg(false));
    f.connect_retry_counter = 40;
    assert_eq!(f.backoff(), Duration::from_secs(60));
}

#[test]
fn hold_timer_expiry_in_established_sends_code_4_and_reports_down() {
    let mut f = established();
    assert_eq!(f.fsm_event(Event::HoldTimerExpires), Some(State::Idle));
    let a = f.take_actions();
    assert_eq!(notification_sent(&a).0, 4);
    assert!(a.iter().any(|x| matches!(x, Action::SessionDown(_))));
}

#[test]
fn keepalive_and_update_restart_the_hold_timer() {
    let mut f = established();
    assert_eq!(f.fsm_event(Event::UpdateMsg), None);
    assert_eq!(
        f.take_actions(),
        vec![Action::StartTimer(Timer::Hold, Duration::from_secs(3))]
    );
    assert_eq!(f.fsm_event(Event::KeepaliveTimerExpires), None);
    let a = f.take_actions();
    assert_eq!(sent(&a), vec![Message::Keepalive]);
    assert!(a.contains(&Action::StartTimer(
        Timer::Keepalive,
        Duration::from_secs(1)
    )));
}

#[test]
fn update_error_sends_the_given_notification() {
    let mut f = established();
    let n = Notification::new(3, 1);
    assert_eq!(
        f.fsm_event(Event::UpdateMsgErr(n.clone())),
        Some(State::Idle)
    );
    assert_eq!(sent(&f.take_actions()), vec![Message::Notification(n)]);
}

#[test]
fn manual_stop_sends_cease_and_does_not_restart() {
    let mut f = established();
    assert_eq!(f.fsm_event(Event::ManualStop), Some(State::Idle));
    let a = f.take_actions();
    assert_eq!(notification_sent(&a), (6, 2));
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::StartTimer(Timer::IdleHold, _)))
    );
    assert_eq!(
        f.fsm_event(Event::AutomaticStart),
        None,
        "stopped stays Idle"
    );
}

#[test]
fn unexpected_open_in_established_is_an_fsm_error() {
    let mut f = established();
    assert_eq!(
        f.fsm_event(Event::BgpOpen(peer_open(65000, 3))),
        Some(State::Idle)
    );
    assert_eq!(notification_sent(&f.take_actions()), (5, 3));
}

#[test]
fn notification_from_peer_drops_to_idle() {
    let mut f = established();
    assert_eq!(
        f.fsm_event(Event::NotifMsg(Notification::new(6, 2))),
        Some(State::Idle)
    );
    assert!(
        sent(&f.take_actions()).is_empty(),
        "never answer a NOTIFICATION"
    );
}

#[test]
fn idle_ignores_connections() {
    let mut f = Fsm::new(cfg(false));
    assert_eq!(f.fsm_event(Event::TcpConnectionConfirmed), None);
    assert!(f.take_actions().is_empty());
}

#[test]
fn collision_keeps_the_higher_identifier_side() {
    let lo = Ipv4Addr::new(10, 0, 0, 1);
    let hi = Ipv4Addr::new(10, 0, 0, 2);
    assert_eq!(resolve_collision(hi, lo), CollisionWinner::Outbound);
    assert_eq!(resolve_collision(lo, hi), CollisionWinner::Inbound);
    let mut f = open_sent();
    assert_eq!(f.fsm_event(Event::OpenCollisionDump), Some(State::Active));
    assert_eq!(notification_sent(&f.take_actions()), (6, 7));
    // The winning inbound connection is then handed in.
    assert_eq!(
        f.fsm_event(Event::TcpConnectionConfirmed),
        Some(State::OpenSent)
    );
}

#[test]
fn ibgp_same_identifier_is_rejected() {
    let mut c = cfg(false);
    c.peer_asn = c.local_asn;
    let mut f = open_sent_with(c.clone());
    let o = Box::new(Open::new(c.local_asn, 3, c.bgp_id, &[Afi::Ipv4]));
    assert_eq!(f.fsm_event(Event::BgpOpen(o)), Some(State::Idle));
    assert_eq!(notification_sent(&f.take_actions()), (2, 3));
}

#[test]
fn zero_hold_time_disables_keepalives() {
    let mut f = open_sent();
    f.fsm_event(Event::BgpOpen(peer_open(65000, 0)));
    let a = f.take_actions();
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::StartTimer(Timer::Keepalive, _)))
    );
    assert!(a.contains(&Action::StopTimer(Timer::Hold)));
}

#[test]
fn manual_stop_during_backoff_cancels_the_restart() {
    let mut f = Fsm::new(cfg(false));
    f.fsm_event(Event::ManualStart);
    f.fsm_event(Event::TcpConnectionFails);
    f.fsm_event(Event::TcpCrAcked);
    f.fsm_event(Event::HoldTimerExpires);
    assert_eq!(f.state(), State::Idle);
    f.take_actions();
    assert_eq!(f.fsm_event(Event::ManualStop), None);
    assert_eq!(f.take_actions(), vec![Action::StopTimer(Timer::IdleHold)]);
    assert_eq!(f.fsm_event(Event::IdleHoldTimerExpires), None, "stays Idle");
}

#[test]
fn extra_capabilities_go_into_our_open() {
    let gr = Capability::Unknown {
        code: 64,
        value: vec![0x80, 0x78, 0, 1, 1, 0x80],
    };
    let mut f = Fsm::new(FsmConfig {
        extra_capabilities: vec![gr.clone()],
        ..cfg(false)
    });
    f.fsm_event(Event::ManualStart);
    f.take_actions();
    f.fsm_event(Event::TcpCrAcked);
    match sent(&f.take_actions()).as_slice() {
        [Message::Open(o)] => assert_eq!(o.capabilities.last(), Some(&gr)),
        other => panic!("expected one OPEN, got {other:?}"),
    }
}
