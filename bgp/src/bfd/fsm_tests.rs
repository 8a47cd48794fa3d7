//! Every transition of RFC 5880 §6.2 and the timer rules, without sockets.

use super::*;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn cfg() -> BfdConfig {
    BfdConfig {
        min_rx: ms(100),
        min_tx: ms(100),
        multiplier: 3,
        port: 3784,
    }
}

fn peer(state: State, your: u32) -> Control {
    Control {
        diag: Diag::None,
        state,
        poll: false,
        fin: false,
        cpi: false,
        demand: false,
        detect_mult: 5,
        my_disc: 77,
        your_disc: your,
        desired_min_tx: ms(200),
        required_min_rx: ms(50),
        required_min_echo_rx: Duration::ZERO,
    }
}

fn up_session() -> Session {
    let mut s = Session::new(cfg(), 9);
    s.event(Event::Rx(peer(State::Down, 0)));
    s.event(Event::Rx(peer(State::Up, 9)));
    assert_eq!(s.state(), State::Up);
    s.take_actions();
    s
}

#[test]
fn starts_down_sending_slowly() {
    let mut s = Session::new(cfg(), 9);
    assert_eq!(s.state(), State::Down);
    assert_eq!(s.take_actions(), vec![Action::TxInterval(Some(SLOW_TX))]);
    let p = s.periodic();
    assert_eq!((p.state, p.my_disc, p.your_disc), (State::Down, 9, 0));
    assert_eq!(p.desired_min_tx, SLOW_TX);
    assert_eq!(p.required_min_rx, ms(100));
    assert_eq!(p.detect_mult, 3);
    assert_eq!(s.detection_time(), None);
}

#[test]
fn three_way_handshake_down_init_up() {
    let mut s = Session::new(cfg(), 9);
    s.take_actions();
    let t = s.event(Event::Rx(peer(State::Down, 0))).unwrap();
    assert_eq!((t.from, t.to), (State::Down, State::Init));
    assert_eq!(s.remote_disc(), 77);
    // Detection: the peer's multiplier 5 x max(our 100 ms, its 200 ms).
    assert_eq!(s.detection_time(), Some(ms(1000)));
    let acts = s.take_actions();
    assert!(
        acts.contains(&Action::DetectTimer(Some(ms(1000)))),
        "{acts:?}"
    );
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Send(c) if c.state == State::Init && c.your_disc == 77)),
        "{acts:?}"
    );
    let t = s.event(Event::Rx(peer(State::Init, 9))).unwrap();
    assert_eq!((t.from, t.to, t.failure), (State::Init, State::Up, true));
    // Up: the configured 100 ms (the peer accepts 50 ms), announced with a Poll.
    let acts = s.take_actions();
    assert!(
        acts.contains(&Action::TxInterval(Some(ms(100)))),
        "{acts:?}"
    );
    let p = s.periodic();
    assert!(p.poll && p.desired_min_tx == ms(100), "{p:?}");
    // The peer's Final ends the poll.
    s.event(Event::Rx(Control {
        fin: true,
        ..peer(State::Up, 9)
    }));
    assert!(!s.periodic().poll);
}

#[test]
fn down_straight_to_up_on_peer_init() {
    let mut s = Session::new(cfg(), 9);
    let t = s.event(Event::Rx(peer(State::Init, 9))).unwrap();
    assert_eq!(t.to, State::Up);
}

#[test]
fn detection_timeout_takes_up_to_down_and_forgets_the_peer() {
    let mut s = up_session();
    let t = s.event(Event::DetectTimerExpired).unwrap();
    assert_eq!((t.from, t.to), (State::Up, State::Down));
    assert_eq!(t.diag, Diag::DetectionTimeExpired);
    assert!(t.failure);
    assert_eq!(s.remote_disc(), 0);
    let p = s.periodic();
    assert_eq!((p.diag, p.your_disc), (Diag::DetectionTimeExpired, 0));
    assert_eq!(p.desired_min_tx, SLOW_TX);
    let acts = s.take_actions();
    assert!(
        acts.contains(&Action::TxInterval(Some(SLOW_TX))),
        "{acts:?}"
    );
    // Timing out while Down changes nothing.
    assert_eq!(s.event(Event::DetectTimerExpired), None);
}

#[test]
fn peer_down_is_a_failure_peer_admin_down_is_not() {
    let mut s = up_session();
    let t = s.event(Event::Rx(peer(State::Down, 9))).unwrap();
    assert_eq!(
        (t.to, t.diag, t.failure),
        (State::Down, Diag::NeighborDown, true)
    );

    let mut s = up_session();
    let t = s.event(Event::Rx(peer(State::AdminDown, 9))).unwrap();
    assert_eq!(
        (t.to, t.diag, t.failure),
        (State::Down, Diag::NeighborDown, false)
    );
    // And while it stays AdminDown we stay Down.
    assert_eq!(s.event(Event::Rx(peer(State::AdminDown, 9))), None);
    assert_eq!(s.state(), State::Down);
}

#[test]
fn poll_from_the_peer_is_answered_with_final() {
    let mut s = up_session();
    s.event(Event::Rx(Control {
        poll: true,
        ..peer(State::Up, 9)
    }));
    let acts = s.take_actions();
    let fin = acts.iter().find_map(|a| match a {
        Action::Send(c) => Some(*c),
        _ => None,
    });
    let fin = fin.expect("no Final sent");
    assert!(fin.fin && !fin.poll, "{fin:?}");
}

#[test]
fn tx_interval_follows_the_peers_min_rx_and_zero_stops_sending() {
    let mut s = up_session();
    s.event(Event::Rx(Control {
        required_min_rx: ms(400),
        ..peer(State::Up, 9)
    }));
    assert!(
        s.take_actions()
            .contains(&Action::TxInterval(Some(ms(400))))
    );
    s.event(Event::Rx(Control {
        required_min_rx: Duration::ZERO,
        ..peer(State::Up, 9)
    }));
    assert!(s.take_actions().contains(&Action::TxInterval(None)));
}

#[test]
fn admin_down_tells_the_peer_and_stops() {
    let mut s = up_session();
    let t = s.event(Event::AdminDown).unwrap();
    assert_eq!((t.to, t.failure), (State::AdminDown, false));
    let acts = s.take_actions();
    assert!(acts.contains(&Action::TxInterval(None)), "{acts:?}");
    assert!(
        acts.iter().any(
            |a| matches!(a, Action::Send(c) if c.state == State::AdminDown && c.diag == Diag::AdminDown)
        ),
        "{acts:?}"
    );
    // Packets after that change nothing.
    assert_eq!(s.event(Event::Rx(peer(State::Up, 9))), None);
}

#[test]
fn an_up_session_resumes_in_a_new_process_without_a_transition() {
    let mut old = up_session();
    let mut fin = peer(State::Up, 9);
    fin.fin = true; // the poll that lowered our interval, answered
    old.event(Event::Rx(fin));
    old.take_actions();
    let r = old.resume_state().expect("Up: resumable");
    assert_eq!(
        r,
        Resume {
            local_disc: 9,
            remote_disc: 77,
            remote_min_tx: ms(200),
            remote_min_rx: ms(50),
            remote_mult: 5,
        }
    );
    let mut s = Session::resume(cfg(), r);
    assert_eq!(s.state(), State::Up);
    assert_eq!((s.local_disc(), s.remote_disc()), (9, 77));
    // the Up rate (ours 100 ms, the peer accepts 50), detection 5 x max(100, 200)
    // at once, and the first packet now: Up, both discriminators, no Poll
    assert_eq!(s.detection_time(), Some(ms(1000)));
    let a = s.take_actions();
    assert_eq!(a[0], Action::TxInterval(Some(ms(100))));
    assert_eq!(a[1], Action::DetectTimer(Some(ms(1000))));
    let Action::Send(p) = &a[2] else {
        panic!("{a:?}")
    };
    assert_eq!(
        (p.state, p.my_disc, p.your_disc, p.poll, p.fin),
        (State::Up, 9, 77, false, false)
    );
    assert_eq!((p.desired_min_tx, p.required_min_rx), (ms(100), ms(100)));
    assert_eq!(a.len(), 3, "no transition reported: {a:?}");
    assert_eq!(
        s.periodic(),
        old.periodic(),
        "the peer sees the same session"
    );

    // it behaves as an Up session: the peer's Up keeps it, its Down ends it
    assert_eq!(s.event(Event::Rx(peer(State::Up, 9))), None);
    let t = s.event(Event::Rx(peer(State::Down, 9))).unwrap();
    assert_eq!((t.from, t.to, t.failure), (State::Up, State::Down, true));
    // and a detection timeout ends it like any other
    let mut s = Session::resume(cfg(), r);
    let t = s.event(Event::DetectTimerExpired).unwrap();
    assert_eq!((t.to, t.diag), (State::Down, Diag::DetectionTimeExpired));
}

#[test]
fn only_an_up_session_without_a_poll_in_flight_is_resumable() {
    assert_eq!(Session::new(cfg(), 9).resume_state(), None);
    let mut s = Session::new(cfg(), 9);
    s.event(Event::Rx(peer(State::Down, 0)));
    assert_eq!(s.state(), State::Init);
    assert_eq!(s.resume_state(), None);
    // Up, but the poll that lowers our interval is not answered yet
    s.event(Event::Rx(peer(State::Up, 9)));
    assert_eq!(s.state(), State::Up);
    assert_eq!(s.resume_state(), None, "poll in flight");
    let mut fin = peer(State::Up, 9);
    fin.fin = true;
    s.event(Event::Rx(fin));
    assert!(s.resume_state().is_some());
    s.event(Event::AdminDown);
    assert_eq!(s.resume_state(), None);
}
