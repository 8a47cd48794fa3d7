//! The scripted BGP peer of the in-process speaker tests (bgp_session, bfd_session):
//! one accepted loopback connection, read and written message by message.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::time::Duration;

use ringlb_bgp::codec::{self, Afi, Decoded, Message, Open, Update};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// The scripted peer's side of one connection.
pub(crate) struct FakePeer {
    pub s: TcpStream,
}

impl FakePeer {
    pub(crate) async fn read_raw(&mut self) -> Option<Vec<u8>> {
        let mut h = [0u8; 19];
        timeout(Duration::from_secs(6), self.s.read_exact(&mut h))
            .await
            .ok()?
            .ok()?;
        let len = usize::from(u16::from_be_bytes([h[16], h[17]]));
        let mut m = vec![0u8; len];
        m[..19].copy_from_slice(&h);
        timeout(Duration::from_secs(6), self.s.read_exact(&mut m[19..]))
            .await
            .ok()?
            .ok()?;
        Some(m)
    }

    /// Next message that is not a KEEPALIVE.
    pub(crate) async fn read(&mut self) -> Option<Message> {
        loop {
            let raw = self.read_raw().await?;
            let m = match codec::decode(&raw, true).expect("speaker sent a malformed message") {
                Decoded::Message(m) => m,
                Decoded::Update(u) => Message::Update(u.update),
            };
            if m != Message::Keepalive {
                return Some(m);
            }
        }
    }

    pub(crate) async fn send(&mut self, m: &Message) {
        self.s.write_all(&m.encode().unwrap()).await.unwrap();
    }

    pub(crate) async fn send_raw(&mut self, b: &[u8]) {
        let _ = self.s.write_all(b).await;
    }

    /// OPEN exchange up to Established; returns the speaker's OPEN.
    pub(crate) async fn handshake(&mut self, asn: u32) -> Open {
        let Some(Message::Open(theirs)) = self.read().await else {
            panic!("expected OPEN")
        };
        self.send(&Message::Open(Open::new(
            asn,
            3,
            Ipv4Addr::new(10, 0, 0, 1),
            &[Afi::Ipv4, Afi::Ipv6],
        )))
        .await;
        self.send(&Message::Keepalive).await;
        theirs
    }

    /// Collect UPDATEs until both End-of-RIB markers arrived.
    pub(crate) async fn initial_dump(&mut self) -> Vec<Update> {
        let mut ups = Vec::new();
        let mut eors = 0;
        while eors < 2 {
            match self.read().await {
                Some(Message::Update(u)) if u == Update::default() => eors += 1,
                Some(Message::Update(u)) if u.attrs.is_none() && u.withdrawn.is_empty() => {
                    eors += 1
                }
                Some(Message::Update(u)) => ups.push(u),
                other => panic!("expected UPDATE, got {other:?}"),
            }
        }
        ups
    }
}

pub(crate) async fn accept(l: &TcpListener) -> FakePeer {
    let (s, _) = timeout(Duration::from_secs(8), l.accept())
        .await
        .expect("the speaker did not connect")
        .unwrap();
    FakePeer { s }
}
