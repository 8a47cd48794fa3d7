//! One owner task per peer. It owns the [`Fsm`], the timers and the Adj-RIB-Out, and
//! carries out the FSM's actions. I/O happens in child tasks that talk to it through
//! channels:
//!
//! ```text
//!  Speaker ──routes (watch)──┐        ┌── inbound TcpStream ── listener task(s)
//!          ──PeerCmd (mpsc)──┤        │
//!                            v        v
//!                     ┌──────────────────────┐ ── PeerStatus (watch) ──> callers
//!                     │  peer task (owner)   │
//!                     │  Fsm + timers + RIB  │
//!                     └──────────────────────┘
//!             bytes (mpsc) │     ^ ConnEvent (mpsc)      ^ (id, TcpStream) (mpsc)
//!                          v     │                       │
//!                    writer task  reader task       connect task (one per attempt)
//!                      (one pair per TCP connection)
//! ```

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use ipnetwork::IpNetwork;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::codec::{self, Afi, CodecError, Decoded, HEADER_LEN, Message, Notification, notif};
use super::config::{ExportPolicy, PeerConfig};
use super::fsm::{self, Action, CollisionWinner, Event, Fsm, FsmConfig, Negotiated, State, Timer};
use super::gr::RestartState;
use super::metrics::{BgpMetrics, Labels};
use super::rib::{self, AdjRibOut, RouteTable, SessionView};
use super::{md5, ttl};

/// What callers can see of a peer (a `tokio::sync::watch` value).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerStatus {
    pub state: State,
    pub advertised: usize,
    /// The prefixes sent to the peer in UPDATEs and not withdrawn since: the
    /// Adj-RIB-Out, which the export policy and the negotiated families filter.
    /// Empty while the session is down.
    pub sent: Arc<BTreeSet<IpNetwork>>,
    pub updates_sent: u64,
    pub updates_received: u64,
    pub flaps: u64,
    pub last_error: Option<String>,
    pub last_transition: SystemTime,
    pub negotiated: Option<Negotiated>,
}

impl Default for PeerStatus {
    fn default() -> Self {
        PeerStatus {
            state: State::Idle,
            advertised: 0,
            sent: Default::default(),
            updates_sent: 0,
            updates_received: 0,
            flaps: 0,
            last_error: None,
            last_transition: SystemTime::now(),
            negotiated: None,
        }
    }
}

/// Commands from the speaker.
pub(crate) enum PeerCmd {
    /// Send pending withdrawals, NOTIFICATION Cease, close, and end the task.
    Stop { done: oneshot::Sender<()> },
    /// A new export policy: re-diff the Adj-RIB-Out, no session reset.
    SetPolicy(ExportPolicy),
    /// The peer's BFD session failed (the diagnostic): reset the session now.
    BfdDown(&'static str),
}

enum ConnEvent {
    Msg(u64, Vec<u8>),
    BadHeader(u64, CodecError),
    Closed(u64, String),
}

/// Most bytes a connection may have queued for the peer. A peer that keeps its
/// session alive but stops reading (zero TCP window) would otherwise grow our memory
/// without bound; past this the connection is closed as failed.
const MAX_QUEUED: usize = 32 * 1024 * 1024;

/// One TCP connection: a writer queue and the reader task.
struct Conn {
    id: u64,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    local: SocketAddr,
    outbound: bool,
}

impl Conn {
    /// Queues `b` for the peer. Over [`MAX_QUEUED`] the queue is closed instead: the
    /// writer then ends and reports the connection failed.
    fn send(&self, b: Vec<u8>) {
        let n = b.len();
        if self.queued.fetch_add(n, Ordering::Relaxed) + n > MAX_QUEUED {
            self.queued.store(usize::MAX / 2, Ordering::Relaxed);
            return;
        }
        let _ = self.tx.send(b);
    }
}

async fn read_loop(id: u64, rd: OwnedReadHalf, tx: mpsc::Sender<ConnEvent>) {
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    loop {
        let mut h = [0u8; HEADER_LEN];
        if let Err(e) = rd.read_exact(&mut h).await {
            let _ = tx.send(ConnEvent::Closed(id, e.to_string())).await;
            return;
        }
        let len = match codec::check_header(&h) {
            Ok((len, _)) => len,
            Err(e) => {
                let _ = tx.send(ConnEvent::BadHeader(id, e)).await;
                return;
            }
        };
        let mut m = vec![0u8; len];
        m[..HEADER_LEN].copy_from_slice(&h);
        if let Err(e) = rd.read_exact(&mut m[HEADER_LEN..]).await {
            let _ = tx.send(ConnEvent::Closed(id, e.to_string())).await;
            return;
        }
        if tx.send(ConnEvent::Msg(id, m)).await.is_err() {
            return;
        }
    }
}

async fn write_loop(
    id: u64,
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    events: mpsc::Sender<ConnEvent>,
) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(b) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&b);
        // Coalesce what is already queued into one write.
        while buf.len() < 60 * 1024 {
            match rx.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if queued.load(Ordering::Relaxed) > MAX_QUEUED {
            let why = format!("peer is not reading: over {MAX_QUEUED} bytes queued");
            let _ = events.send(ConnEvent::Closed(id, why)).await;
            return;
        }
        if wr.write_all(&buf).await.is_err() {
            return;
        }
        queued.fetch_sub(
            buf.len().min(queued.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    }
    let _ = wr.shutdown().await;
}

/// Open the outbound connection: MD5 key and source address before connect().
async fn connect(cfg: PeerConfig) -> std::io::Result<TcpStream> {
    let remote = SocketAddr::new(cfg.address, cfg.port);
    let v6 = cfg.address.is_ipv6();
    let sock = if v6 {
        TcpSocket::new_v6()?
    } else {
        TcpSocket::new_v4()?
    };
    if let Some(pw) = &cfg.password {
        md5::set_md5_key(&sock, v6, cfg.address, pw.as_bytes()).map_err(std::io::Error::other)?;
    }
    ttl::apply(&sock, v6, ttl::policy(&cfg))?;
    if let Some(src) = cfg.source_address {
        sock.bind(SocketAddr::new(src, 0))?;
    }
    let s = tokio::time::timeout(cfg.connect_retry, sock.connect(remote))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    prepare(&s, &cfg);
    Ok(s)
}

fn prepare(s: &TcpStream, cfg: &PeerConfig) {
    let _ = s.set_nodelay(true);
    let v6 = s.local_addr().is_ok_and(|a| a.is_ipv6());
    if let Err(e) = ttl::apply(s, v6, ttl::policy(cfg)) {
        tracing::warn!(error = %e, "cannot set the session's TTL / GTSM");
    }
}

pub(crate) struct PeerTask {
    cfg: PeerConfig,
    label: Labels,
    name: String,
    fsm: Fsm,
    routes: watch::Receiver<RouteTable>,
    cmds: mpsc::Receiver<PeerCmd>,
    inbound: mpsc::Receiver<TcpStream>,
    ev_tx: mpsc::Sender<ConnEvent>,
    ev_rx: mpsc::Receiver<ConnEvent>,
    conn_tx: mpsc::Sender<(u64, std::io::Result<TcpStream>)>,
    conn_rx: mpsc::Receiver<(u64, std::io::Result<TcpStream>)>,
    connecting: Option<(u64, JoinHandle<()>)>,
    conn: Option<Conn>,
    /// An inbound connection that arrived in OpenSent/OpenConfirm (collision).
    pending: Option<Conn>,
    closing: Vec<JoinHandle<()>>,
    timers: HashMap<Timer, Instant>,
    sent: AdjRibOut,
    session: Option<SessionView>,
    status: watch::Sender<PeerStatus>,
    metrics: BgpMetrics,
    next_id: u64,
    rng: u64,
    restart: RestartState,
}

impl PeerTask {
    pub(crate) fn new(
        cfg: PeerConfig,
        routes: watch::Receiver<RouteTable>,
        cmds: mpsc::Receiver<PeerCmd>,
        inbound: mpsc::Receiver<TcpStream>,
        status: watch::Sender<PeerStatus>,
        metrics: BgpMetrics,
        restart: RestartState,
    ) -> PeerTask {
        let fsm = Fsm::new(FsmConfig {
            local_asn: cfg.local_asn,
            peer_asn: cfg.peer_asn,
            bgp_id: cfg.router_id,
            hold_time: cfg.hold_time,
            keepalive: cfg.keepalive,
            connect_retry: cfg.connect_retry,
            passive: cfg.passive,
            families: cfg.families.clone(),
            max_backoff: Duration::from_secs(30),
            extra_capabilities: cfg.gr_capabilities(restart),
        });
        let (ev_tx, ev_rx) = mpsc::channel(256);
        let (conn_tx, conn_rx) = mpsc::channel(4);
        let name = cfg.address.to_string();
        let rng = seed(&name);
        PeerTask {
            label: BgpMetrics::peer(&name),
            name,
            cfg,
            fsm,
            routes,
            cmds,
            inbound,
            ev_tx,
            ev_rx,
            conn_tx,
            conn_rx,
            connecting: None,
            conn: None,
            pending: None,
            closing: Vec::new(),
            timers: HashMap::new(),
            sent: AdjRibOut::new(),
            session: None,
            status,
            rng,
            metrics,
            next_id: 0,
            restart,
        }
    }

    pub(crate) async fn run(mut self) {
        self.publish_state();
        self.event(if self.cfg.passive {
            Event::ManualStartPassive
        } else {
            Event::ManualStart
        });
        loop {
            let deadline = self.timers.values().min().copied();
            let established = self.fsm.state() == State::Established;
            tokio::select! {
                cmd = self.cmds.recv() => match cmd {
                    Some(PeerCmd::SetPolicy(p)) => {
                        self.cfg.policy = p;
                        self.sync_routes();
                    }
                    Some(PeerCmd::BfdDown(diag)) => self.bfd_down(diag),
                    Some(PeerCmd::Stop { done }) => {
                        self.stop().await;
                        let _ = done.send(());
                        return;
                    }
                    None => {
                        self.stop().await;
                        return;
                    }
                },
                Some(ev) = self.ev_rx.recv() => self.on_conn_event(ev),
                Some((id, res)) = self.conn_rx.recv() => self.on_connect(id, res),
                Some(stream) = self.inbound.recv() => self.on_inbound(stream),
                _ = sleep_until_opt(deadline), if deadline.is_some() => self.on_timers(),
                r = self.routes.changed(), if established => match r {
                    Ok(()) => self.sync_routes(),
                    Err(_) => { self.stop().await; return; }
                },
            }
        }
    }

    async fn stop(&mut self) {
        if self.fsm.state() == State::Established {
            self.sync_routes(); // withdrawals the speaker queued before stopping
        }
        self.event(Event::ManualStop);
        self.conn = None;
        let closing = std::mem::take(&mut self.closing);
        for mut h in closing {
            // A writer stuck on a peer that does not read is stopped, not leaked.
            if tokio::time::timeout(Duration::from_secs(2), &mut h)
                .await
                .is_err()
            {
                h.abort();
            }
        }
    }

    /// RFC 5882 §4.3: BFD Down resets the session at once, with Cease / BFD Down
    /// (RFC 9384), which a peer that stopped forwarding will most likely never read.
    fn bfd_down(&mut self, diag: &'static str) {
        if matches!(
            self.fsm.state(),
            State::OpenSent | State::OpenConfirm | State::Established
        ) {
            tracing::warn!(diag, "BFD down: resetting the session");
            self.metrics.error(&self.name, "bfd_down");
            let n = Notification::new(notif::CEASE, super::bfd::CEASE_BFD_DOWN);
            self.event(Event::BgpMessageErr(n));
        }
    }

    fn event(&mut self, ev: Event) {
        let changed = self.fsm.fsm_event(ev);
        for a in self.fsm.take_actions() {
            self.act(a);
        }
        if let Some(s) = changed {
            tracing::info!(state = s.as_str(), "BGP state change");
            self.publish_state();
        }
    }

    fn publish_state(&mut self) {
        let st = self.fsm.state();
        self.metrics
            .session_state
            .get_or_create(&self.label)
            .set(st.mib_value());
        let neg = self.fsm.negotiated().cloned();
        self.status.send_modify(|s| {
            s.state = st;
            s.last_transition = SystemTime::now();
            s.negotiated = neg;
        });
    }

    fn new_conn(&mut self, stream: TcpStream, outbound: bool) -> Option<Conn> {
        let local = stream.local_addr().ok()?;
        self.next_id += 1;
        let id = self.next_id;
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let reader = tokio::spawn(read_loop(id, rd, self.ev_tx.clone()));
        let writer = tokio::spawn(write_loop(id, wr, rx, queued.clone(), self.ev_tx.clone()));
        Some(Conn {
            id,
            tx,
            queued,
            reader,
            writer,
            local,
            outbound,
        })
    }

    fn drop_conn(&mut self, c: Conn) {
        c.reader.abort();
        self.closing.retain(|h| !h.is_finished());
        // Writers still flushing to peers that do not read are bounded too: past a
        // few, the oldest is stopped.
        while self.closing.len() >= 4 {
            self.closing.remove(0).abort();
        }
        self.closing.push(c.writer);
        // Dropping `c.tx` lets the writer flush what is queued, then close.
    }

    fn act(&mut self, a: Action) {
        match a {
            Action::Connect => {
                if let Some((_, h)) = self.connecting.take() {
                    h.abort();
                }
                self.next_id += 1;
                let id = self.next_id;
                let tx = self.conn_tx.clone();
                let cfg = self.cfg.clone();
                let h = tokio::spawn(async move {
                    let r = connect(cfg).await;
                    let _ = tx.send((id, r)).await;
                });
                self.connecting = Some((id, h));
            }
            Action::Disconnect => {
                if let Some((_, h)) = self.connecting.take() {
                    h.abort();
                }
                if let Some(c) = self.conn.take() {
                    self.drop_conn(c);
                }
                if let Some(c) = self.pending.take() {
                    self.drop_conn(c);
                }
                self.session = None;
            }
            Action::Send(m) => match m.encode() {
                Ok(b) => {
                    if let Some(c) = &self.conn {
                        c.send(b)
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot encode message"),
            },
            Action::StartTimer(t, d) => {
                // RFC 4271 §10: jitter ConnectRetry, Keepalive (and our restart backoff)
                // to 75..100% so many edges do not move in lockstep. Never the hold timer.
                let d = if t == Timer::Hold { d } else { self.jitter(d) };
                self.timers.insert(t, Instant::now() + d);
            }
            Action::StopTimer(t) => {
                self.timers.remove(&t);
            }
            Action::SessionUp(n) => self.session_up(n),
            Action::SessionDown(reason) => {
                tracing::warn!(%reason, "session down");
                self.sent.clear();
                self.metrics.flaps.get_or_create(&self.label).inc();
                self.metrics
                    .prefixes_advertised
                    .get_or_create(&self.label)
                    .set(0);
                self.status.send_modify(|s| {
                    s.flaps += 1;
                    s.advertised = 0;
                    s.sent = Default::default();
                });
            }
            Action::Error { kind, message } => {
                tracing::warn!(error = %message, kind, "BGP session error");
                self.metrics.error(&self.name, kind);
                self.status.send_modify(|s| s.last_error = Some(message));
            }
        }
    }

    fn jitter(&mut self, d: Duration) -> Duration {
        // xorshift64: no crypto needed, only de-synchronisation between edges.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        d.mul_f64(0.75 + (x % 1000) as f64 / 4000.0)
    }

    fn session_up(&mut self, n: Negotiated) {
        let Some(c) = &self.conn else { return };
        let view = SessionView {
            local_addr: c.local.ip().to_canonical(),
            ipv4: n.families.contains(&Afi::Ipv4),
            ipv6: n.families.contains(&Afi::Ipv6),
        };
        tracing::info!(
            hold = n.hold_time.as_secs(),
            families = ?n.families,
            peer_id = %n.peer_bgp_id,
            "session established"
        );
        self.session = Some(view);
        if self.restart.restarted {
            // RFC 4724: the R bit is for the first session after the restart only.
            self.restart.restarted = false;
            self.fsm.cfg.extra_capabilities = self.cfg.gr_capabilities(self.restart);
        }
        self.sent.clear();
        self.sync_routes();
        // End-of-RIB per family (RFC 4724), so the peer knows the initial dump is done.
        for f in n.families {
            if let (Ok(b), Some(c)) = (codec::end_of_rib(f), &self.conn) {
                c.send(b);
            }
        }
    }

    /// Bring the peer's Adj-RIB-Out in line with the route table.
    fn sync_routes(&mut self) {
        let (Some(view), Some(conn)) = (self.session, &self.conn) else {
            return;
        };
        let four = self
            .fsm
            .negotiated()
            .map(|n| n.four_octet_asn)
            .unwrap_or(false);
        let mut want = {
            let t = self.routes.borrow_and_update();
            rib::adj_rib_out(&t, &self.cfg, &view)
        };
        let (withdrawn, groups) = rib::diff(&self.sent, &want);
        let mut msgs = Vec::new();
        if !withdrawn.is_empty() {
            match codec::encode_updates(&withdrawn, None, four) {
                Ok(m) => msgs.extend(m),
                Err(e) => tracing::error!(error = %e, "cannot encode withdrawals"),
            }
        }
        for (attrs, prefixes) in &groups {
            match codec::encode_updates(&[], Some((attrs, prefixes)), four) {
                Ok(m) => msgs.extend(m),
                Err(e) => {
                    tracing::error!(error = %e, count = prefixes.len(), "cannot encode UPDATE; not announced");
                    for p in prefixes {
                        match self.sent.get(p) {
                            Some(old) => want.insert(*p, old.clone()),
                            None => want.remove(p),
                        };
                    }
                }
            }
        }
        let n = msgs.len() as u64;
        for m in msgs {
            conn.send(m);
        }
        self.sent = want;
        let adv = self.sent.len();
        self.metrics
            .updates_sent
            .get_or_create(&self.label)
            .inc_by(n);
        self.metrics
            .prefixes_advertised
            .get_or_create(&self.label)
            .set(adv as i64);
        if n > 0 {
            tracing::debug!(messages = n, advertised = adv, "sent UPDATEs");
        }
        let sent: Arc<BTreeSet<IpNetwork>> = Arc::new(self.sent.keys().copied().collect());
        self.status.send_modify(|s| {
            s.updates_sent += n;
            s.advertised = adv;
            s.sent = sent;
        });
        // UPDATEs count as KEEPALIVEs for the peer's hold timer, but RFC 4271 wants
        // our keepalive timer restarted only when we send a KEEPALIVE; keep it simple.
    }

    fn on_timers(&mut self) {
        let now = Instant::now();
        let expired: Vec<Timer> = self
            .timers
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            self.timers.remove(&t);
            self.event(match t {
                Timer::ConnectRetry => Event::ConnectRetryTimerExpires,
                Timer::Hold => Event::HoldTimerExpires,
                Timer::Keepalive => Event::KeepaliveTimerExpires,
                Timer::IdleHold => Event::IdleHoldTimerExpires,
            });
        }
    }

    fn on_connect(&mut self, id: u64, res: std::io::Result<TcpStream>) {
        if self.connecting.as_ref().map(|(i, _)| *i) != Some(id) {
            return; // a stale attempt
        }
        self.connecting = None;
        match res {
            Ok(stream) if matches!(self.fsm.state(), State::Connect | State::Active) => {
                if let Some(c) = self.new_conn(stream, true) {
                    self.conn = Some(c);
                    self.event(Event::TcpCrAcked);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "connect failed");
                self.metrics.error(&self.name, "connect_failed");
                self.status
                    .send_modify(|s| s.last_error = Some(format!("connect: {e}")));
                self.event(Event::TcpConnectionFails);
            }
        }
    }

    fn on_inbound(&mut self, stream: TcpStream) {
        prepare(&stream, &self.cfg);
        match self.fsm.state() {
            State::Connect | State::Active => {
                if let Some((_, h)) = self.connecting.take() {
                    h.abort();
                }
                if let Some(c) = self.new_conn(stream, false) {
                    self.conn = Some(c);
                    self.event(Event::TcpConnectionConfirmed);
                }
            }
            State::OpenSent | State::OpenConfirm if self.pending.is_none() => {
                // Collision (RFC 4271 §6.8): wait for this connection's OPEN.
                self.pending = self.new_conn(stream, false);
            }
            State::Established => {
                // Refuse with Cease/Connection Rejected.
                tokio::spawn(async move {
                    let mut s = stream;
                    if let Ok(b) = Message::Notification(Notification::new(
                        notif::CEASE,
                        notif::CONNECTION_REJECTED,
                    ))
                    .encode()
                    {
                        let _ = s.write_all(&b).await;
                    }
                });
            }
            _ => drop(stream),
        }
    }

    fn on_conn_event(&mut self, ev: ConnEvent) {
        let id = match &ev {
            ConnEvent::Msg(id, _) | ConnEvent::BadHeader(id, _) | ConnEvent::Closed(id, _) => *id,
        };
        if self.pending.as_ref().map(|c| c.id) == Some(id) {
            self.on_pending_event(ev);
            return;
        }
        if self.conn.as_ref().map(|c| c.id) != Some(id) {
            return; // from a connection already dropped
        }
        match ev {
            ConnEvent::Closed(_, why) => {
                tracing::debug!(%why, "connection closed");
                self.event(Event::TcpConnectionFails);
            }
            ConnEvent::BadHeader(_, e) => {
                self.metrics.error(&self.name, e.metric_label());
                self.event(Event::BgpMessageErr(e.notification()));
            }
            ConnEvent::Msg(_, bytes) => self.on_message(&bytes),
        }
    }

    fn on_message(&mut self, bytes: &[u8]) {
        let four = self
            .fsm
            .negotiated()
            .map(|n| n.four_octet_asn)
            .unwrap_or(true);
        match codec::decode(bytes, four) {
            Err(e) => {
                tracing::warn!(error = %e, "malformed message from peer");
                self.metrics.error(&self.name, e.metric_label());
                let n = e.notification();
                self.event(if n.code == notif::UPDATE {
                    Event::UpdateMsgErr(n)
                } else {
                    Event::BgpMessageErr(n)
                });
            }
            Ok(Decoded::Update(u)) => {
                self.metrics
                    .updates_received
                    .get_or_create(&self.label)
                    .inc();
                self.status.send_modify(|s| s.updates_received += 1);
                if let Some(reason) = u.treat_as_withdraw {
                    // RFC 7606: keep the session, drop the routes. We import nothing
                    // from peers, so there is nothing else to undo.
                    tracing::warn!(reason, "malformed UPDATE: treat-as-withdraw");
                    self.metrics.error(&self.name, "treat_as_withdraw");
                }
                self.event(Event::UpdateMsg);
            }
            Ok(Decoded::Message(m)) => match m {
                Message::Open(o) => self.event(Event::BgpOpen(Box::new(o))),
                Message::Keepalive => self.event(Event::KeepAliveMsg),
                Message::Notification(n) => self.event(Event::NotifMsg(n)),
                Message::RouteRefresh { .. } => {
                    if self.fsm.state() == State::Established {
                        self.sent.clear();
                        self.sync_routes();
                    }
                    self.event(Event::UpdateMsg);
                }
                Message::Update(_) => self.event(Event::UpdateMsg),
            },
        }
    }

    fn on_pending_event(&mut self, ev: ConnEvent) {
        let open = match ev {
            ConnEvent::Msg(_, b) => match codec::decode(&b, true) {
                Ok(Decoded::Message(Message::Open(o))) => Some(o),
                _ => None,
            },
            _ => None,
        };
        let Some(open) = open else {
            if let Some(c) = self.pending.take() {
                self.drop_conn(c);
            }
            return;
        };
        let current_outbound = self.conn.as_ref().is_some_and(|c| c.outbound);
        // RFC 4271 §6.8: a collision with an Established session always closes the new
        // connection.
        let established = self.fsm.state() == State::Established;
        let winner = fsm::resolve_collision(self.cfg.router_id, open.bgp_id);
        tracing::info!(?winner, established, "connection collision");
        if established || !current_outbound || winner == CollisionWinner::Outbound {
            if let Some(c) = self.pending.take() {
                if let Ok(b) = Message::Notification(Notification::new(
                    notif::CEASE,
                    notif::CONNECTION_COLLISION,
                ))
                .encode()
                {
                    c.send(b);
                }
                self.drop_conn(c);
            }
            return;
        }
        let Some(winner_conn) = self.pending.take() else {
            return;
        };
        self.event(Event::OpenCollisionDump);
        if let Some(old) = self.conn.take() {
            self.drop_conn(old);
        }
        self.conn = Some(winner_conn);
        self.event(Event::TcpConnectionConfirmed);
        self.event(Event::BgpOpen(Box::new(open)));
    }
}

/// A per-peer, per-process seed for the timer jitter (never zero).
fn seed(name: &str) -> u64 {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (t ^ h ^ u64::from(std::process::id())) | 1
}

async fn sleep_until_opt(d: Option<Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
