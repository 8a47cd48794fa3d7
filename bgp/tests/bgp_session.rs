//! The in-process speaker API against a scripted peer on loopback (no root needed):
//! announce / withdraw reach the wire, the peer state is a watchable value, malformed
//! input gets the right NOTIFICATION and the session comes back with backoff, RFC 7606
//! treat-as-withdraw keeps the session, hold-timer expiry, drain with
//! GRACEFUL_SHUTDOWN, passive open, and a live mutation fuzz of the session.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use prometheus_client::registry::Registry;
use ringlb_bgp::codec::{
    self, Afi, Decoded, Message, Notification, Open, PathAttrs, Update, notif,
};
use ringlb_bgp::config::GRACEFUL_SHUTDOWN;
use ringlb_bgp::fsm::State;
use ringlb_bgp::{PeerConfig, PeerStatus, RouteAttrs, Speaker};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

mod fake_peer;
use fake_peer::{FakePeer, accept};

const LOCAL_ASN: u32 = 65011;
const PEER_ASN: u32 = 65000;

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn peer_cfg(port: u16, passive: bool) -> PeerConfig {
    let address = IpAddr::V4(Ipv4Addr::LOCALHOST);
    PeerConfig {
        port,
        hold_time: 3,
        keepalive: 1,
        connect_retry: Duration::from_secs(1),
        passive,
        next_hop_v6: Some("fd00::11".parse().unwrap()),
        ..PeerConfig::new(address, LOCAL_ASN, PEER_ASN, Ipv4Addr::new(10, 0, 0, 11))
    }
}

async fn setup() -> (Speaker, TcpListener, Registry) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut reg = Registry::with_prefix("ringlb");
    let sp = Speaker::start(0, &mut reg).unwrap();
    sp.add_peer(peer_cfg(l.local_addr().unwrap().port(), false))
        .unwrap();
    (sp, l, reg)
}

/// The next connection from the speaker, through the OPENs and its initial dump.
async fn accept_established(l: &TcpListener) -> FakePeer {
    let mut p = accept(l).await;
    p.handshake(PEER_ASN).await;
    p.initial_dump().await;
    p
}

/// The peer's status now.
fn status(sp: &Speaker) -> PeerStatus {
    let rx = sp.peer_status(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    rx.borrow().clone()
}

async fn wait_state(sp: &Speaker, want: State) {
    let mut rx = sp.peer_status(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    timeout(Duration::from_secs(8), rx.wait_for(|s| s.state == want))
        .await
        .unwrap_or_else(|_| panic!("peer never reached {want:?}"))
        .unwrap();
}

#[tokio::test]
async fn announce_withdraw_and_peer_state_watch() {
    let (sp, l, reg) = setup().await;
    sp.announce(
        net("10.1.0.1/32"),
        RouteAttrs {
            communities: vec![(65011 << 16) | 5],
            large_communities: vec![[65011, 7, 8]],
            med: Some(3),
            ..Default::default()
        },
    );
    sp.announce(net("fd00:1::1/128"), RouteAttrs::default());
    let mut p = accept(&l).await;
    let open = p.handshake(PEER_ASN).await;
    assert_eq!(open.asn(), LOCAL_ASN);
    let ups = p.initial_dump().await;
    let v4 = ups
        .iter()
        .find(|u| u.nlri == vec![net("10.1.0.1/32")])
        .expect("v4 UPDATE");
    let a = v4.attrs.as_ref().unwrap();
    assert_eq!(a.as_path, vec![LOCAL_ASN]);
    assert_eq!(
        a.next_hop,
        Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        "next-hop self"
    );
    assert_eq!(a.communities, vec![(65011 << 16) | 5]);
    assert_eq!(a.large_communities, vec![[65011, 7, 8]]);
    assert_eq!(a.med, Some(3));
    let v6 = ups
        .iter()
        .find(|u| u.nlri == vec![net("fd00:1::1/128")])
        .expect("v6 UPDATE");
    assert_eq!(
        v6.attrs.as_ref().unwrap().next_hop,
        Some("fd00::11".parse().unwrap())
    );

    wait_state(&sp, State::Established).await;
    let st = sp.peer_status(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    assert!(
        timeout(
            Duration::from_secs(2),
            st.clone().wait_for(|s| s.advertised == 2)
        )
        .await
        .is_ok(),
        "status.advertised != 2: {:?}",
        *st.borrow()
    );

    // Many prefixes sharing attributes travel together.
    let many: Vec<_> = (0..300u32)
        .map(|i| {
            (
                IpNetwork::new(IpAddr::V4(Ipv4Addr::from(0x0a02_0000 + i)), 32).unwrap(),
                RouteAttrs::default(),
            )
        })
        .collect();
    sp.announce_many(many);
    let mut got = 0;
    let mut msgs = 0;
    while got < 300 {
        match p.read().await {
            Some(Message::Update(u)) => {
                got += u.nlri.len();
                msgs += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        msgs <= 2,
        "300 /32s with one attribute set took {msgs} UPDATEs"
    );

    sp.withdraw(net("10.1.0.1/32"));
    match p.read().await {
        Some(Message::Update(u)) => assert_eq!(u.withdrawn, vec![net("10.1.0.1/32")]),
        other => panic!("expected withdrawal, got {other:?}"),
    }

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
    assert!(
        text.contains("ringlb_bgp_session_state{peer=\"127.0.0.1\"} 6"),
        "{text}"
    );
    assert!(
        text.contains("ringlb_bgp_prefixes_advertised{peer=\"127.0.0.1\"} 301"),
        "{text}"
    );
    sp.shutdown().await;
}

#[tokio::test]
async fn malformed_update_gets_notification_then_session_restarts() {
    let (sp, l, _reg) = setup().await;
    let mut p = accept_established(&l).await;
    // Unrecognized well-known attribute 99 -> UPDATE Message Error / 2.
    let mut bad = vec![0xff; 16];
    bad.extend_from_slice(&[0, 26, 2, 0, 0, 0, 3, 0x40, 99, 0]);
    p.send_raw(&bad).await;
    match p.read().await {
        Some(Message::Notification(n)) => assert_eq!((n.code, n.subcode), (3, 2)),
        other => panic!("expected NOTIFICATION, got {other:?}"),
    }
    assert!(p.read_raw().await.is_none(), "connection must be closed");
    let t = Instant::now();
    let mut p2 = accept(&l).await;
    let waited = t.elapsed();
    p2.handshake(PEER_ASN).await;
    p2.initial_dump().await;
    wait_state(&sp, State::Established).await;
    let st = status(&sp);
    assert_eq!(st.flaps, 1);
    assert!(st.last_error.unwrap().contains("UPDATE Message Error"));
    assert!(
        waited >= Duration::from_millis(500),
        "no backoff before reconnecting: {waited:?}"
    );
    sp.shutdown().await;
}

#[tokio::test]
async fn treat_as_withdraw_keeps_the_session() {
    let (sp, l, _reg) = setup().await;
    let mut p = accept_established(&l).await;
    // ORIGIN value 5 with a prefix: RFC 7606 treat-as-withdraw, no NOTIFICATION.
    let mut taw = vec![0xff; 16];
    taw.extend_from_slice(&[0, 42, 2, 0, 0, 0, 14]);
    taw.extend_from_slice(&[
        0x40, 1, 1, 5, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1, 32, 10, 200, 100, 1,
    ]);
    p.send_raw(&taw).await;
    sp.announce(net("10.9.9.9/32"), RouteAttrs::default());
    match p.read().await {
        Some(Message::Update(u)) => assert_eq!(u.nlri, vec![net("10.9.9.9/32")]),
        other => panic!("session should carry on, got {other:?}"),
    }
    let st = status(&sp);
    assert_eq!(st.state, State::Established);
    assert_eq!(st.flaps, 0);
    sp.shutdown().await;
}

#[tokio::test]
async fn wrong_peer_as_is_refused_with_bad_peer_as() {
    let (sp, l, _reg) = setup().await;
    let mut p = accept(&l).await;
    p.handshake(64999).await;
    match p.read().await {
        Some(Message::Notification(n)) => assert_eq!((n.code, n.subcode), (2, 2)),
        other => panic!("{other:?}"),
    }
    sp.shutdown().await;
}

#[tokio::test]
async fn silent_peer_hits_the_hold_timer() {
    let (sp, l, _reg) = setup().await;
    let mut p = accept(&l).await;
    p.handshake(PEER_ASN).await;
    let t = Instant::now();
    // Send nothing more; read until the speaker gives up.
    let n = loop {
        match p.read().await {
            Some(Message::Notification(n)) => break n,
            Some(_) => continue,
            None => panic!("closed without NOTIFICATION"),
        }
    };
    assert_eq!(n.code, notif::HOLD_TIMER_EXPIRED);
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(2500) && e < Duration::from_secs(5),
        "after {e:?}"
    );
    sp.shutdown().await;
}

#[tokio::test]
async fn drain_tags_graceful_shutdown_then_withdraws_then_cease() {
    let (sp, l, _reg) = setup().await;
    sp.announce(net("10.1.0.1/32"), RouteAttrs::default());
    let mut p = accept_established(&l).await;
    let t = Instant::now();
    let drain = Duration::from_millis(600);
    let (_, seen) = tokio::join!(
        async {
            sp.drain(drain).await;
            sp.shutdown().await;
        },
        async {
            let mut seen = Vec::new();
            while let Some(m) = p.read().await {
                seen.push((t.elapsed(), m));
            }
            seen
        }
    );
    let tagged = seen.iter().find_map(|(at, m)| match m {
        Message::Update(Update {
            attrs: Some(PathAttrs { communities, .. }),
            ..
        }) if communities.contains(&GRACEFUL_SHUTDOWN) => Some(*at),
        _ => None,
    });
    let withdrawn = seen.iter().find_map(|(at, m)| match m {
        Message::Update(u) if u.withdrawn == vec![net("10.1.0.1/32")] => Some(*at),
        _ => None,
    });
    let cease = seen.iter().position(|(_, m)| {
        matches!(
            m,
            Message::Notification(Notification {
                code: 6,
                subcode: 2,
                ..
            })
        )
    });
    let tagged = tagged.expect("no GRACEFUL_SHUTDOWN re-announce");
    let withdrawn = withdrawn.expect("no withdrawal");
    assert!(
        tagged < Duration::from_millis(300),
        "tagged late: {tagged:?}"
    );
    assert!(
        withdrawn >= drain,
        "withdrawn before the drain time: {withdrawn:?}"
    );
    assert_eq!(cease, Some(seen.len() - 1), "Cease must be last: {seen:?}");
}

#[tokio::test]
async fn passive_peer_accepts_the_connection() {
    // Find a free port for the speaker's listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut reg = Registry::default();
    let sp = Speaker::start(port, &mut reg).unwrap();
    sp.add_peer(peer_cfg(179, true)).unwrap();
    sp.announce(net("10.1.0.1/32"), RouteAttrs::default());
    let s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    let mut p = FakePeer { s };
    // In passive mode the peer talks first.
    p.send(&Message::Open(Open::new(
        PEER_ASN,
        3,
        Ipv4Addr::new(10, 0, 0, 1),
        &[Afi::Ipv4],
    )))
    .await;
    let Some(Message::Open(_)) = p.read().await else {
        panic!("no OPEN")
    };
    p.send(&Message::Keepalive).await;
    let mut got = None;
    while got.is_none() {
        match p.read().await {
            Some(Message::Update(u)) if !u.nlri.is_empty() => got = Some(u),
            Some(_) => {}
            None => panic!("closed"),
        }
    }
    assert_eq!(got.unwrap().nlri, vec![net("10.1.0.1/32")]);
    sp.shutdown().await;
}

#[tokio::test]
async fn live_fuzz_the_session_never_kills_the_speaker() {
    let (sp, l, _reg) = setup().await;
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Garbage before, inside and after the OPEN exchange, on successive sessions.
    for round in 0..6 {
        let mut p = accept(&l).await;
        if round % 2 == 1 {
            p.handshake(PEER_ASN).await;
        }
        let len = 19 + (rnd() % 60) as usize;
        let mut junk: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        if round % 3 != 0 {
            junk[..16].fill(0xff);
            junk[16..18].copy_from_slice(&(len as u16).to_be_bytes());
            junk[18] = 1 + (rnd() % 5) as u8;
        }
        p.send_raw(&junk).await;
        // The speaker answers with a NOTIFICATION or keeps going; either way it must
        // still be there for the next round.
        let _ = timeout(Duration::from_secs(1), p.read_raw()).await;
    }
    let _p = accept_established(&l).await;
    wait_state(&sp, State::Established).await;
    sp.shutdown().await;
}

/// Both sides open a connection at once (RFC 4271 §6.8). `remote_id` decides which
/// survives: the connection opened by the side with the higher BGP Identifier.
async fn collision(remote_id: Ipv4Addr) -> (Option<Message>, Option<Message>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut reg = Registry::default();
    let sp = Speaker::start(port, &mut reg).unwrap();
    sp.add_peer(peer_cfg(l.local_addr().unwrap().port(), false))
        .unwrap();
    // Connection A: the speaker's outbound one. Read its OPEN, answer nothing yet.
    let mut a = accept(&l).await;
    let Some(Message::Open(_)) = a.read().await else {
        panic!("no OPEN on A")
    };
    // Connection B: ours to the speaker, with our OPEN.
    let s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    let mut b = FakePeer { s };
    b.send(&Message::Open(Open::new(
        PEER_ASN,
        3,
        remote_id,
        &[Afi::Ipv4],
    )))
    .await;
    let first_b = b.read().await;
    let first_a = timeout(Duration::from_secs(1), a.read())
        .await
        .ok()
        .flatten();
    if first_a.is_none() {
        // A survived: finish the handshake on it.
        a.send(&Message::Open(Open::new(
            PEER_ASN,
            3,
            remote_id,
            &[Afi::Ipv4],
        )))
        .await;
        a.send(&Message::Keepalive).await;
        wait_state(&sp, State::Established).await;
    }
    sp.shutdown().await;
    (first_a, first_b)
}

#[tokio::test]
async fn collision_higher_remote_id_keeps_the_inbound_connection() {
    // Speaker id 10.0.0.11 < 10.0.0.200: dump A (ours), continue on B with an OPEN.
    let (a, b) = collision(Ipv4Addr::new(10, 0, 0, 200)).await;
    assert!(
        matches!(
            a,
            Some(Message::Notification(Notification {
                code: 6,
                subcode: 7,
                ..
            }))
        ),
        "A should get Cease/Connection Collision Resolution, got {a:?}"
    );
    assert!(
        matches!(b, Some(Message::Open(_))),
        "B should continue with OPEN, got {b:?}"
    );
}

#[tokio::test]
async fn collision_lower_remote_id_keeps_the_outbound_connection() {
    let (a, b) = collision(Ipv4Addr::new(10, 0, 0, 2)).await;
    assert_eq!(a, None, "A (outbound) must stay and reach Established");
    assert!(
        matches!(
            b,
            Some(Message::Notification(Notification {
                code: 6,
                subcode: 7,
                ..
            }))
        ),
        "B should get Cease/Connection Collision Resolution, got {b:?}"
    );
}

#[tokio::test]
async fn route_refresh_resends_the_adj_rib_out_and_v6_withdraw_uses_mp_unreach() {
    let (sp, l, _reg) = setup().await;
    sp.announce(net("10.1.0.1/32"), RouteAttrs::default());
    sp.announce(net("fd00:1::1/128"), RouteAttrs::default());
    let mut p = accept(&l).await;
    p.handshake(PEER_ASN).await;
    assert_eq!(p.initial_dump().await.len(), 2);
    p.send(&Message::RouteRefresh { afi: 1, safi: 1 }).await;
    let mut again = Vec::new();
    while again.len() < 2 {
        match p.read().await {
            Some(Message::Update(u)) => again.extend(u.nlri),
            other => panic!("expected the routes again, got {other:?}"),
        }
    }
    again.sort();
    assert_eq!(again, vec![net("10.1.0.1/32"), net("fd00:1::1/128")]);
    sp.withdraw(net("fd00:1::1/128"));
    let raw = loop {
        let raw = p.read_raw().await.expect("withdrawal");
        if raw[18] == 2 {
            break raw;
        }
    };
    // No withdrawn-routes field; one MP_UNREACH_NLRI (type 15) attribute.
    assert_eq!(&raw[19..21], &[0, 0]);
    assert_eq!(raw[24], 15, "attribute type: {raw:02x?}");
    match codec::decode(&raw, true).unwrap() {
        Decoded::Update(u) => assert_eq!(u.update.withdrawn, vec![net("fd00:1::1/128")]),
        other => panic!("{other:?}"),
    }
    sp.shutdown().await;
}

#[tokio::test]
async fn set_peers_changes_policy_in_place_and_restarts_only_on_session_changes() {
    use ringlb_bgp::config::ExportRule;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let mut reg = Registry::default();
    let sp = Speaker::start(0, &mut reg).unwrap();
    sp.announce(net("10.1.0.1/32"), RouteAttrs::default());
    sp.set_peers(vec![peer_cfg(port, false)]).await.unwrap();
    let mut p = accept_established(&l).await;

    // New policy (a BGPAdvertisement appeared): re-announce with the community, same
    // session.
    let mut with_policy = peer_cfg(port, false);
    with_policy.policy.rules.push(ExportRule {
        communities: vec![(65011 << 16) | 42],
        ..Default::default()
    });
    sp.set_peers(vec![with_policy.clone()]).await.unwrap();
    match p.read().await {
        Some(Message::Update(u)) => {
            assert_eq!(u.nlri, vec![net("10.1.0.1/32")]);
            assert_eq!(u.attrs.unwrap().communities, vec![(65011 << 16) | 42]);
        }
        other => panic!("expected a re-announce on the same session, got {other:?}"),
    }
    let st = sp.peer_status(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    assert_eq!(st.borrow().flaps, 0);

    // A session setting changed: Cease, then a new session.
    let mut new_hold = with_policy.clone();
    new_hold.hold_time = 6;
    sp.set_peers(vec![new_hold]).await.unwrap();
    match p.read().await {
        Some(Message::Notification(n)) => assert_eq!(n.code, notif::CEASE),
        other => panic!("{other:?}"),
    }
    let mut p2 = accept(&l).await;
    let open = p2.handshake(PEER_ASN).await;
    assert_eq!(open.hold_time, 6);

    // Peer gone from the objects: Cease and forgotten.
    sp.set_peers(vec![]).await.unwrap();
    loop {
        match p2.read().await {
            Some(Message::Notification(n)) => {
                assert_eq!(n.code, notif::CEASE);
                break;
            }
            Some(_) => {}
            None => panic!("closed without Cease"),
        }
    }
    assert!(sp.peer_status(IpAddr::V4(Ipv4Addr::LOCALHOST)).is_none());
    assert!(sp.peers().is_empty());
}
