//! The in-process API the rest of edge-lb uses: announce / withdraw prefixes, add and
//! remove peers, watch each peer's state, drain and shut down.
//!
//! ```text
//!   caller ── announce/withdraw ──> routes: watch<RouteTable> ──> every peer task
//!   caller ── add_peer/remove_peer ──> spawns / stops peer tasks (session.rs)
//!   listener task per family ── accepted TcpStream, by peer address ──> peer task
//! ```

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnetwork::IpNetwork;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::Error;
use super::bfd::hold::{HeldBfd, HoldStore};
use super::bfd::metrics::BfdMetrics;
use super::bfd::socket::Hub;
use super::bfd::task::{BfdHandle, BfdStatus, Resumed};
use super::config::{PeerConfig, RouteAttrs};
use super::fsm::State;
use super::gr::RestartState;
use super::md5;
use super::metrics::BgpMetrics;
use super::reach::PeerView;
use super::rib::RouteTable;
use super::session::{PeerCmd, PeerStatus, PeerTask};

struct PeerHandle {
    cfg: PeerConfig,
    cmd: mpsc::Sender<PeerCmd>,
    status: watch::Receiver<PeerStatus>,
    task: JoinHandle<()>,
    bfd: Option<BfdHandle>,
}

type InboundMap = Arc<Mutex<HashMap<IpAddr, mpsc::Sender<TcpStream>>>>;

/// The BGP speaker of one edge node.
pub struct Speaker {
    routes: watch::Sender<RouteTable>,
    peers: Mutex<HashMap<IpAddr, PeerHandle>>,
    inbound: InboundMap,
    listeners: Vec<Arc<TcpListener>>,
    accept_tasks: Vec<JoinHandle<()>>,
    metrics: BgpMetrics,
    restart: Mutex<RestartState>,
    bfd: BfdHub,
}

/// BFD receive sockets, bound when the first peer with BFD is added.
struct BfdHub {
    port: u16,
    hub: Mutex<Option<Arc<Hub>>>,
    metrics: BfdMetrics,
    /// Where sessions are held across a hitless restart, and what an earlier
    /// process left there that no peer has resumed yet.
    hold: Mutex<Option<HoldState>>,
}

/// The hold store and the sessions it offered that no peer claimed yet.
type HoldState = (Arc<dyn HoldStore>, Vec<HeldBfd>);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(128)?;
    TcpListener::from_std(s.into())
}

async fn accept_loop(l: Arc<TcpListener>, inbound: InboundMap) {
    loop {
        let (stream, from) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ip = from.ip().to_canonical();
        let tx = lock(&inbound).get(&ip).cloned();
        match tx {
            Some(tx) => {
                let _ = tx.try_send(stream);
            }
            None => tracing::debug!(%ip, "refused connection from an unconfigured peer"),
        }
    }
}

/// Whether a session in `state` with `negotiated` keeps our routes across a
/// restart: not up (it holds none), or up with the peer's graceful restart.
fn gr_holds(state: crate::fsm::State, negotiated: Option<&crate::fsm::Negotiated>) -> bool {
    state != crate::fsm::State::Established || negotiated.is_some_and(|n| n.peer_graceful_restart)
}

impl Speaker {
    /// Start the speaker: listen on `listen_port` (0: no passive open) on every IPv4
    /// and IPv6 address, and register the metrics.
    pub fn start(listen_port: u16, registry: &mut Registry) -> Result<Speaker, Error> {
        Self::start_with_bfd_port(listen_port, super::bfd::CONTROL_PORT, registry)
    }

    /// [`Speaker::start`] receiving BFD on another UDP port than 3784 (0: any; tests).
    pub fn start_with_bfd_port(
        listen_port: u16,
        bfd_port: u16,
        registry: &mut Registry,
    ) -> Result<Speaker, Error> {
        let bfd = BfdHub {
            port: bfd_port,
            hub: Mutex::new(None),
            metrics: BfdMetrics::register(registry),
            hold: Mutex::new(None),
        };
        let metrics = BgpMetrics::register(registry);
        let (routes, _) = watch::channel(RouteTable::default());
        let inbound: InboundMap = Arc::default();
        let mut listeners = Vec::new();
        if listen_port != 0 {
            let v4 = SocketAddr::new(IpAddr::V4([0, 0, 0, 0].into()), listen_port);
            listeners.push(Arc::new(bind_listener(v4).map_err(|e| Error::Io {
                what: format!("listening on {v4}"),
                source: e,
            })?));
            let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), listen_port);
            match bind_listener(v6) {
                Ok(l) => listeners.push(Arc::new(l)),
                Err(e) => {
                    tracing::warn!(error = %e, "no IPv6 listener; IPv6 peers need active open")
                }
            }
        }
        let accept_tasks = listeners
            .iter()
            .map(|l| tokio::spawn(accept_loop(l.clone(), inbound.clone())))
            .collect();
        Ok(Speaker {
            routes,
            peers: Mutex::new(HashMap::new()),
            inbound,
            listeners,
            accept_tasks,
            metrics,
            restart: Mutex::new(RestartState::default()),
            bfd,
        })
    }

    /// Start the BFD session of a new peer; its failures reach the peer task as
    /// [`PeerCmd::BfdDown`].
    fn start_bfd(
        &self,
        cfg: &PeerConfig,
        cmd: mpsc::Sender<PeerCmd>,
    ) -> Result<Option<BfdHandle>, Error> {
        let Some(b) = cfg.bfd else { return Ok(None) };
        let io = |e| Error::Io {
            what: format!("BFD with {}", cfg.address),
            source: e,
        };
        let hub = {
            let mut h = lock(&self.bfd.hub);
            match &*h {
                Some(hub) => hub.clone(),
                None => {
                    let hub =
                        Arc::new(Hub::start(self.bfd.port, self.bfd.metrics.clone()).map_err(io)?);
                    *h = Some(hub.clone());
                    hub
                }
            }
        };
        let (tx, mut rx) = mpsc::channel(4);
        let handle = super::bfd::task::spawn(
            hub,
            b,
            cfg.address,
            cfg.source_address,
            tx,
            self.bfd.metrics.clone(),
            self.claim_held_bfd(cfg, &b),
        )
        .map_err(io)?;
        tokio::spawn(async move {
            while let Some(d) = rx.recv().await {
                if cmd.send(PeerCmd::BfdDown(d.diag.as_str())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Some(handle))
    }

    /// The held session an earlier process left for this peer, if its settings
    /// still match; one that does not is released (the session starts afresh).
    fn claim_held_bfd(&self, cfg: &PeerConfig, b: &super::bfd::BfdConfig) -> Option<Resumed> {
        let mut hold = lock(&self.bfd.hold);
        let (store, offers) = hold.as_mut()?;
        let i = offers.iter().position(|o| {
            o.peer == cfg.address && cfg.source_address.is_none_or(|a| a == o.local.ip())
        })?;
        let held = offers.swap_remove(i);
        if !held.matches(b) {
            tracing::info!(peer = %cfg.address, "BFD settings changed across the restart: not resuming the held session");
            store.release(held.local, held.peer);
            return None;
        }
        let store = store.clone();
        Some(Resumed {
            held,
            on_first_send: Box::new(move || store.release(held.local, held.peer)),
        })
    }

    /// Hold BFD sessions in `store` across hitless restarts: sessions it offers
    /// (an earlier process's) are resumed by the peers added from now on, and
    /// [`Speaker::bfd_hold_or_admin_down`] hands sessions to it. Set it before the
    /// first `add_peer`.
    pub fn set_bfd_hold_store(&self, store: Arc<dyn HoldStore>) {
        let offers = store.offers();
        if !offers.is_empty() {
            tracing::info!(
                sessions = offers.len(),
                "BFD sessions held by the datapath: resuming them"
            );
        }
        *lock(&self.bfd.hold) = Some((store, offers));
    }

    /// For a hitless restart: every BFD session that is Up, IPv4, with a peer
    /// that has graceful restart and is covered by the hold store is handed to
    /// the store for the peer's restart time, without AdminDown (a ToR whose BFD
    /// client is not graceful would drop the edge on it); the others end with
    /// AdminDown as [`Speaker::bfd_admin_down`]. Returns the held sessions.
    pub async fn bfd_hold_or_admin_down(&self) -> Vec<HeldBfd> {
        let store = lock(&self.bfd.hold).as_ref().map(|(s, _)| s.clone());
        let handles: Vec<(Option<Duration>, BfdHandle)> = lock(&self.peers)
            .values_mut()
            .filter_map(|h| {
                let gr = h
                    .cfg
                    .graceful_restart_time
                    .filter(|t| *t > 0)
                    .map(|t| Duration::from_secs(t.into()));
                Some((gr, h.bfd.take()?))
            })
            .collect();
        let mut held = Vec::new();
        for (gr, h) in handles {
            match (&store, gr) {
                (Some(store), Some(gr)) => {
                    let taken = h
                        .hold(|s| {
                            let s = HeldBfd { hold_for: gr, ..*s };
                            if !s.paced() {
                                tracing::info!(peer = %s.peer, "BFD timers too asymmetric for one answer per packet: not held, AdminDown");
                                return false;
                            }
                            s.peer.is_ipv4()
                                && store.covers(s.peer, s.local)
                                && store.hold(&[s]).is_empty()
                        })
                        .await;
                    held.extend(taken.map(|s| HeldBfd { hold_for: gr, ..s }));
                }
                _ => h.stop().await,
            }
        }
        held
    }

    /// The peer's BFD session, as a watchable value (None: no BFD with that peer).
    pub fn bfd_status(&self, addr: IpAddr) -> Option<watch::Receiver<BfdStatus>> {
        lock(&self.peers)
            .get(&addr)
            .and_then(|h| h.bfd.as_ref().map(|b| b.status.clone()))
    }

    /// End every BFD session with AdminDown (RFC 5880 §6.8.16), so the peers' BFD
    /// does not report a failure: before a restart that leaves the routes to graceful
    /// restart, whose gap would otherwise be a BFD failure that flushes them.
    pub async fn bfd_admin_down(&self) {
        let handles: Vec<BfdHandle> = lock(&self.peers)
            .values_mut()
            .filter_map(|h| h.bfd.take())
            .collect();
        for h in handles {
            h.stop().await;
        }
    }

    /// The UDP port BFD is received on, once a peer with BFD was added.
    pub fn bfd_port(&self) -> Option<u16> {
        lock(&self.bfd.hub).as_ref().map(|h| h.port())
    }

    /// Graceful restart (RFC 4724): what the OPENs of the sessions started from now
    /// on say about this start (R and F bits). Set it before the first `add_peer`.
    pub fn set_restart_state(&self, state: RestartState) {
        *lock(&self.restart) = state;
    }

    /// Start a session with a new peer.
    pub fn add_peer(&self, cfg: PeerConfig) -> Result<(), Error> {
        let mut peers = lock(&self.peers);
        if peers.contains_key(&cfg.address) {
            return Err(Error::DuplicatePeer(cfg.address));
        }
        if let Some(pw) = &cfg.password {
            for l in &self.listeners {
                let l_v6 = l.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
                if l_v6 == cfg.address.is_ipv6() {
                    md5::set_md5_key(l.as_ref(), l_v6, cfg.address, pw.as_bytes())?;
                }
            }
        }
        let (cmd_tx, cmd_rx) = mpsc::channel(4);
        // A BFD that cannot start (port 3784 taken, source address not yet on the
        // node) must not cost the peer its BGP session: run it without BFD, loudly.
        let bfd = self.start_bfd(&cfg, cmd_tx.clone()).unwrap_or_else(|e| {
            tracing::error!(peer = %cfg.address, error = %e,
                "BFD could not start: the BGP session runs without BFD until the BGPPeer changes");
            None
        });
        let (in_tx, in_rx) = mpsc::channel(4);
        let (st_tx, st_rx) = watch::channel(PeerStatus::default());
        let span = tracing::info_span!("bgp_peer", peer = %cfg.address);
        let task = PeerTask::new(
            cfg.clone(),
            self.routes.subscribe(),
            cmd_rx,
            in_rx,
            st_tx,
            self.metrics.clone(),
            *lock(&self.restart),
        );
        let handle = tokio::spawn(task.run().instrument(span));
        lock(&self.inbound).insert(cfg.address, in_tx);
        peers.insert(
            cfg.address,
            PeerHandle {
                cfg,
                cmd: cmd_tx,
                status: st_rx,
                task: handle,
                bfd,
            },
        );
        Ok(())
    }

    /// Stop the session with a peer (Cease) and forget it.
    pub async fn remove_peer(&self, addr: IpAddr) {
        let h = lock(&self.peers).remove(&addr);
        lock(&self.inbound).remove(&addr);
        if let Some(h) = h {
            if h.cfg.password.is_some() {
                for l in &self.listeners {
                    let l_v6 = l.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
                    if l_v6 == addr.is_ipv6() {
                        let _ = md5::set_md5_key(l.as_ref(), l_v6, addr, &[]);
                    }
                }
            }
            stop_peer(h).await;
            let labels = BgpMetrics::peer(&addr.to_string());
            self.metrics.session_state.remove(&labels);
            self.metrics.prefixes_advertised.remove(&labels);
        }
    }

    /// Replace the set of peers: add new ones, restart changed ones, stop the rest.
    pub async fn set_peers(&self, want: Vec<PeerConfig>) -> Result<(), Error> {
        let current: HashMap<IpAddr, PeerConfig> = lock(&self.peers)
            .iter()
            .map(|(a, h)| (*a, h.cfg.clone()))
            .collect();
        // Same session settings, other policy: update in place, no session reset.
        let same_session = |a: &PeerConfig, b: &PeerConfig| {
            let mut a = a.clone();
            a.policy = b.policy.clone();
            a == *b
        };
        for (addr, cfg) in &current {
            if !want.iter().any(|w| same_session(w, cfg)) {
                self.remove_peer(*addr).await;
            }
        }
        let mut first_err = None;
        for w in want {
            match current.get(&w.address) {
                Some(c) if *c == w => {}
                Some(c) if same_session(c, &w) => {
                    let cmd = {
                        let mut peers = lock(&self.peers);
                        peers.get_mut(&w.address).map(|h| {
                            h.cfg.policy = w.policy.clone();
                            h.cmd.clone()
                        })
                    };
                    if let Some(cmd) = cmd {
                        let _ = cmd.send(PeerCmd::SetPolicy(w.policy)).await;
                    }
                }
                // one peer's failure does not keep the others from starting
                _ => {
                    if let Err(e) = self.add_peer(w) {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Announce (or change the attributes of) a prefix to every peer whose policy
    /// exports it.
    pub fn announce(&self, prefix: IpNetwork, attrs: RouteAttrs) {
        self.announce_many([(prefix, attrs)]);
    }

    /// Announce many prefixes with one wake-up of the peer tasks.
    pub fn announce_many(&self, routes: impl IntoIterator<Item = (IpNetwork, RouteAttrs)>) {
        self.routes.send_modify(|t| {
            for (p, a) in routes {
                t.routes.insert(p, a);
            }
        });
    }

    pub fn withdraw(&self, prefix: IpNetwork) {
        self.routes
            .send_if_modified(|t| t.routes.remove(&prefix).is_some());
    }

    pub fn withdraw_all(&self) {
        self.routes.send_if_modified(|t| {
            let had = !t.routes.is_empty();
            t.routes.clear();
            had
        });
    }

    /// Prefixes currently announced.
    pub fn announced(&self) -> Vec<IpNetwork> {
        self.routes.borrow().routes.keys().copied().collect()
    }

    /// The peer's state, as a watchable value.
    pub fn peer_status(&self, addr: IpAddr) -> Option<watch::Receiver<PeerStatus>> {
        lock(&self.peers).get(&addr).map(|h| h.status.clone())
    }

    /// True when there are peers, every one has graceful restart configured, and
    /// every Established session negotiated it (the peer's OPEN carried the
    /// capability): only then can a restart without a drain keep the routes
    /// everywhere. A peer whose session is not up holds none of our routes, so it
    /// does not stand in the way.
    pub fn all_peers_graceful_restart(&self) -> bool {
        let peers = lock(&self.peers);
        !peers.is_empty()
            && peers.values().all(|h| {
                let st = h.status.borrow();
                h.cfg.graceful_restart_time.is_some() && gr_holds(st.state, st.negotiated.as_ref())
            })
    }

    pub fn peers(&self) -> Vec<IpAddr> {
        lock(&self.peers).keys().copied().collect()
    }

    /// Every peer's state, negotiated families and sent prefixes, as of now.
    pub fn peer_views(&self) -> Vec<PeerView> {
        lock(&self.peers)
            .values()
            .map(|h| {
                let st = h.status.borrow();
                PeerView {
                    established: st.state == State::Established,
                    families: st
                        .negotiated
                        .as_ref()
                        .map(|n| n.families.clone())
                        .unwrap_or_default(),
                    sent: st.sent.clone(),
                }
            })
            .collect()
    }

    /// Graceful shutdown, step 1 (RFC 8326): re-announce everything with
    /// GRACEFUL_SHUTDOWN, wait `drain`, then withdraw everything.
    pub async fn drain(&self, drain: Duration) {
        tracing::info!(
            drain_s = drain.as_secs_f64(),
            "draining: re-announcing with GRACEFUL_SHUTDOWN"
        );
        self.routes.send_modify(|t| t.draining = true);
        tokio::time::sleep(drain).await;
        tracing::info!("drain time over: withdrawing every prefix");
        self.withdraw_all();
    }

    /// For a hitless restart (graceful restart, RFC 4724): close every session's TCP
    /// connection without a NOTIFICATION and without withdrawing anything, so peers
    /// that negotiated graceful restart keep our routes as stale for the restart
    /// time, while the datapath forwards on. Peers without it drop the routes.
    pub fn abandon(self) {
        tracing::info!("closing BGP sessions without NOTIFICATION (graceful restart)");
        drop(self);
    }

    /// Step 2: send the withdrawals, NOTIFICATION Cease to every peer, close.
    pub async fn shutdown(self) {
        let peers: Vec<PeerHandle> = lock(&self.peers).drain().map(|(_, h)| h).collect();
        for h in peers {
            stop_peer(h).await;
        }
        for t in &self.accept_tasks {
            t.abort();
        }
    }
}

async fn stop_peer(h: PeerHandle) {
    let (done_tx, done_rx) = oneshot::channel();
    if h.cmd.send(PeerCmd::Stop { done: done_tx }).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(5), done_rx).await;
    }
    h.task.abort();
    if let Some(b) = h.bfd {
        b.stop().await;
    }
}

impl Drop for Speaker {
    fn drop(&mut self) {
        for t in &self.accept_tasks {
            t.abort();
        }
        for h in lock(&self.peers).values() {
            h.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::{Negotiated, State};

    #[test]
    fn only_an_established_session_without_the_peers_gr_blocks_a_restart() {
        let n = |gr| Negotiated {
            hold_time: Duration::from_secs(9),
            keepalive: Duration::from_secs(3),
            four_octet_asn: true,
            families: vec![],
            route_refresh: true,
            peer_bgp_id: "10.0.0.1".parse().unwrap(),
            peer_graceful_restart: gr,
        };
        assert!(gr_holds(State::Established, Some(&n(true))));
        assert!(!gr_holds(State::Established, Some(&n(false))));
        assert!(!gr_holds(State::Established, None));
        assert!(
            gr_holds(State::Active, None),
            "a session that is down holds nothing"
        );
        assert!(gr_holds(State::Idle, Some(&n(false))));
    }
}
